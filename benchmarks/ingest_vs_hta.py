"""Kineto ingest speed and memory: tracecal vs HolisticTraceAnalysis, in one run.

    K=../shared/data/traces/kineto
    python benchmarks/ingest_vs_hta.py --repeat 3 $K/dlrm_8rank $K/sampled_2_of_128 $K/single/*.gz
    python benchmarks/ingest_vs_hta.py --scaling 8                 # 1 vs 2 workers on 8 copies of a 30 MB rank
    python benchmarks/ingest_vs_hta.py --end-to-end --repeat 5 $K/dlrm_8rank  # whole commands, imports included

For each run (a directory of rank traces, or one trace file), each case runs in a fresh Python
process (imports excluded from the timing); CPU time and peak RSS come from the kernel's accounting
(``getrusage``, ``/proc``), so that measuring adds nothing to the measured process (see ``_Usage``):
- ``tracecal -j1``: ``ingest_runs`` with one worker into a new database (made and opened as
  trace-ingest does: from the cached empty-database template, DuckDB on one thread) — parse + load (with
  the per-rank half of decode, which runs where each rank is parsed), then the run-wide decode step
  reported separately;
- ``tracecal -j2``: the same with two worker processes (runs with several files only);
- ``hta``: ``TraceAnalysis(trace_dir=...)`` on a directory of links to the same files (HTA parses
  several ranks with a process pool of min(cores, ranks));
- ``hta-j1`` (runs with several files): the same load in one process (``use_multiprocessing=False``),
  the like-for-like opponent of ``tracecal -j1``; ``tracecal -j2`` is set against ``hta``.

Printed per case: wall seconds, MB/s of uncompressed JSON, peak RSS of the main process and of the
largest worker, and the ratio HTA / tracecal (parse + load, and end to end with decode).
``--end-to-end`` times what a user waits for instead: the whole ``trace-ingest -j1`` command (Python
start, imports, parse, load, decode, commit) against a whole Python process that imports HTA and
loads the traces as ``TraceAnalysis`` does, in one process, alternated, each in a fresh process.
Ranks of realistic size (0.3-7 GB), synthetic-from-real, and HTA on them: ``ingest_scale.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

SHARED_KINETO = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "kineto"
STRESS_SOURCE = SHARED_KINETO / "single" / "a100_ddp_rank0_of_2.json.gz"
SCALING_SOURCE = SHARED_KINETO / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz"


# --- measurement in a child process -----------------------------------------------------------------


class _Usage:
    """CPU seconds and peak RSS from the kernel's own accounting, so that measuring costs the measured
    code nothing: no sampler thread (one that polled the process tree every 10 ms took ~1 ms of CPU and
    the GIL per sample on this machine, a tenth of the core the one-worker case runs on).

    - this process: ``getrusage(RUSAGE_SELF)`` (user + system CPU, peak RSS ``ru_maxrss``);
    - finished workers: ``getrusage(RUSAGE_CHILDREN)`` (CPU of every reaped descendant, peak RSS of the
      largest), read after the pool is closed (tracecal's helpers, HTA's process pool);
    - live workers at a mark (tracecal's helpers while decode starts): their CPU from ``/proc``, read once.
    """

    def __init__(self) -> None:
        self._self_at_start = self._self_cpu()
        self._children_at_start = self._children_cpu()

    @staticmethod
    def _self_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    @staticmethod
    def _children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def cpu_seconds(self, live_pids: Sequence[int] = ()) -> float:
        """CPU of this process and its workers since start: reaped ones, and ``live_pids`` as they are now."""
        live = 0.0
        for pid in live_pids:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                live += times.user + times.system
        return self._self_cpu() - self._self_at_start + self._children_cpu() - self._children_at_start + live

    @staticmethod
    def main_peak() -> int:
        """Peak RSS of this process so far, bytes (Linux reports KiB)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    @staticmethod
    def worker_peak() -> int:
        """Peak RSS of the largest reaped worker, bytes (0 when there was none)."""
        return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def stop_forkserver() -> None:
    """Stop multiprocessing's fork server, if one was started, and reap it: the CPU of the worker
    processes it forked (and reaped) then counts in ``RUSAGE_CHILDREN``, and their peak RSS in its
    ``ru_maxrss``. (``_stop`` is the standard library's own way to stop it, used by its tests.)"""
    from multiprocessing import forkserver

    server: Any = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


def _measure_tracecal(run: Path, workers: int, dask: str | None = None) -> dict[str, Any]:
    import importlib

    # The parser, DuckDB, polars and the loader imported first (untimed, as HTA's imports are).
    for module in ("tracecal.sources.kineto.parser", "tracecal.ingest.executors", "pyarrow.vendored.version", "polars"):
        importlib.import_module(module)
    from tracecal.config import resolve_cache_dir
    from tracecal.pipeline import ingest as pipeline_ingest
    from tracecal.sql.connection import open_database

    usage = _Usage()
    started = time.perf_counter()
    decode_stored_run = pipeline_ingest.decode_stored_run
    marks: list[tuple[float, int]] = []  # (CPU s, peak RSS so far) when open, and when the run-wide decode starts

    def mark_then_decode(*args: Any, **kwargs: Any) -> Any:
        marks.append((usage.cpu_seconds(), usage.main_peak()))  # parse + load (+ per-rank decode) done
        return decode_stored_run(*args, **kwargs)

    pipeline_ingest.decode_stored_run = mark_then_decode
    keep = pipeline_ingest._StoredRanks._keep
    storing = [0.0]  # wall seconds putting the ranks' events in the event store: work only this process does

    def timed_keep(self: Any, *args: Any) -> None:
        at = time.perf_counter()
        keep(self, *args)
        storing[0] += time.perf_counter() - at

    pipeline_ingest._StoredRanks._keep = timed_keep  # type: ignore[method-assign]
    options = pipeline_ingest.IngestOptions(workers=workers, dask=dask)
    with tempfile.TemporaryDirectory() as tmp:
        database = Path(tmp) / "bench.duckdb"
        with open_database(database, cache_dir=resolve_cache_dir(), threads=pipeline_ingest.INGEST_THREADS) as con:
            marks.append((usage.cpu_seconds(), usage.main_peak()))
            report = pipeline_ingest.ingest_runs(con, [run], options)
        wall = time.perf_counter() - started
        stop_forkserver()
        cpu = usage.cpu_seconds()  # the workers are reaped now (Dask's too, once its cluster is closed)
    (result,) = report.runs
    return {
        "wall": wall,
        "load": result.load_seconds,
        "store": storing[0],
        "decode": result.decode_seconds,
        "events": result.events,
        "ranks": result.ranks,
        "source_bytes": result.source_bytes,
        "cpu": cpu,
        "load_cpu": marks[-1][0] - marks[0][0],  # with workers: this process only
        "load_rss": marks[-1][1],
        "main_rss": usage.main_peak(),
        "worker_rss": usage.worker_peak(),
    }


def _measure_hta(run: Path, one_process: bool) -> dict[str, Any]:
    """HTA's ``TraceAnalysis(trace_dir=...)``; ``one_process``: the same load with its
    ``use_multiprocessing=False`` (``TraceAnalysis.__init__`` is ``Trace(...)`` then ``load_traces()``)."""
    import logging

    # isort: off
    # A TraceAnalysis user's import first: importing hta.common.trace before it made TraceAnalysis's
    # load ~50 ms slower on h100 (0.13-0.14 vs 0.09 s; the same modules load, the cause is HTA's).
    from hta.trace_analysis import TraceAnalysis
    from hta.common.trace import Trace

    # isort: on

    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        for i, f in enumerate(_trace_files(run)):  # HTA reads every *.json / *.gz of one directory
            os.symlink(f, Path(tmp) / f"{i}_{f.name}")
        usage = _Usage()
        started = time.perf_counter()
        if one_process:
            trace = Trace(trace_dir=tmp)
            trace.load_traces(use_multiprocessing=False)
        else:
            trace = TraceAnalysis(trace_dir=tmp).t
        wall = time.perf_counter() - started
        cpu = usage.cpu_seconds()  # HTA's pool (if any) is closed and reaped by now
        events = sum(len(df) for df in trace.traces.values())
    return {
        "wall": wall,
        "events": events,
        "ranks": len(trace.traces),
        "cpu": cpu,
        "main_rss": usage.main_peak(),
        "worker_rss": usage.worker_peak(),
    }


def _child(case: str, run: Path) -> None:
    if case.startswith("hta"):
        result = _measure_hta(run, one_process=case == "hta-j1")
    else:
        result = _measure_tracecal(run, int(case.removeprefix("tracecal-j")))
    sys.stdout.write(json.dumps(result) + "\n")


def _run_child(case: str, run: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", case, str(run)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        if case.startswith("hta"):  # HTA's own failures are results too (it cannot read every trace)
            return {"failed": out.stderr.strip().splitlines()[-1]}
        sys.exit(f"{case} on {run} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- the comparison -----------------------------------------------------------------------------------


def _trace_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path.resolve()]
    return sorted(p.resolve() for p in path.rglob("*") if p.name.endswith((".json", ".json.gz")))


def _uncompressed_bytes(files: list[Path]) -> int:
    total = 0
    for f in files:
        if f.name.endswith(".gz"):
            with gzip.open(f, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    total += len(chunk)
        else:
            total += f.stat().st_size
    return total


def _mb(n: float) -> str:
    return f"{n / 1e6:8.1f}"


def _best_of(case: str, run: Path, repeat: int) -> dict[str, Any]:
    """The run of ``case`` with the least CPU for parse + load (HTA: in total) out of ``repeat``."""
    results = [_run_child(case, run) for _ in range(repeat)]
    best = min(results, key=lambda r: r.get("load_cpu", r.get("cpu", 0.0)))
    loads = sorted(r["load"] for r in results if "load" in r)
    return {**best, "median_load": loads[len(loads) // 2], "min_load": loads[0]} if loads else best


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def machine_ceiling(repeat: int = 3, n: int = 3_000_000) -> float:
    """Wall-time speed-up of the same pure-Python CPU work (no memory traffic, no I/O) in two
    processes instead of one, best of ``repeat``: what two workers could gain on this machine at this
    moment (2.0 on two idle cores; less when other jobs hold a core or the cores are siblings)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    ratios = []
    for _ in range(repeat):
        started = time.perf_counter()
        _spin(n)
        _spin(n)
        one = time.perf_counter() - started
        started = time.perf_counter()
        helper = context.Process(target=_spin, args=(n,))
        helper.start()
        _spin(n)
        helper.join()
        ratios.append(one / (time.perf_counter() - started))
    return max(ratios)


def _parse_all(files: Sequence[Path]) -> None:
    from tracecal.ingest.parse import parse_trace_file

    for path in files:
        parse_trace_file(path)


def _parse_on_request(conn: Any, files: Sequence[Path]) -> None:
    """A helper for ``parse_ceiling``: parse ``files`` once (warm-up), then each list it is sent."""
    _parse_all(files)
    conn.send(None)
    while (work := conn.recv()) is not None:
        _parse_all(work)
        conn.send(None)


def parse_ceiling(files: Sequence[Path], repeat: int = 3) -> float:
    """Wall-time speed-up of parsing ``files`` (no database) in two warm processes, half each,
    instead of one, best of ``repeat``: what two workers could gain on these files on this machine at
    this moment. Lower than ``machine_ceiling`` when two busy processes slow each other down (shared
    caches and memory bandwidth, or vCPUs that are siblings on the host)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    helper = context.Process(target=_parse_on_request, args=(theirs, files), daemon=True)
    helper.start()
    _parse_all(files)  # warm, as the helper is: imports, first-use costs, caches
    ours.recv()
    ratios = []
    try:
        for _ in range(repeat):
            started = time.perf_counter()
            _parse_all(files)
            one = time.perf_counter() - started
            started = time.perf_counter()
            ours.send(files[1::2])
            _parse_all(files[0::2])
            ours.recv()
            ratios.append(one / (time.perf_counter() - started))
    finally:
        ours.send(None)
        helper.join()
    return max(ratios)


def compare(paths: list[Path], with_hta: bool, repeat: int = 1) -> None:
    header = (
        f"{'run':30s} {'case':11s} {'ranks':>5s} {'events':>7s} {'MB':>6s} {'load s':>7s} {'decode s':>8s} "
        f"{'+dec':>5s} {'total s':>7s} {'CPU s':>12s} {'MB/s':>6s} {'main RSS':>8s} {'wkr RSS':>7s}  HTA ÷ this: "
        "load, total, load CPU"
    )
    print(header)
    print("-" * len(header))
    for path in paths:
        files = _trace_files(path)
        if not files:
            print(f"{path}: no trace files", file=sys.stderr)
            continue
        size = _uncompressed_bytes(files)
        several = len(files) > 1
        cases = ["tracecal-j1"] + (["tracecal-j2"] if several else [])
        if with_hta:  # one rank: HTA parses it in its own process whatever the setting
            cases += ["hta-j1", "hta"] if several else ["hta"]
        results = {case: _best_of(case, path, repeat) for case in cases}
        failures = {case: results.pop(case)["failed"] for case in list(results) if "failed" in results[case]}
        # Like for like: one worker against HTA in one process, two against HTA's pool.
        opponent = {"tracecal-j1": results.get("hta-j1", results.get("hta")), "tracecal-j2": results.get("hta")}
        for case, r in results.items():
            load = r.get("load", r["wall"])
            load_cpu = r.get("load_cpu", r["cpu"])
            decode = f"{r['decode']:8.2f}" if "decode" in r else ""
            adds = f"{100 * r['decode'] / load:4.0f}%" if "decode" in r else ""
            cpu = f"{load_cpu:5.2f}/{r['cpu']:5.2f}" if "load_cpu" in r else f"{r['cpu']:5.2f}"
            ratio = ""
            hta = opponent.get(case)
            if hta is not None:
                ratio = f"{hta['wall'] / load:5.1f}x {hta['wall'] / r['wall']:5.1f}x {hta['cpu'] / load_cpu:5.1f}x"
            print(
                f"{path.name[:30]:30s} {case:11s} {r['ranks']:5d} {r['events']:7d} {size / 1e6:6.1f} {load:7.2f} "
                f"{decode:>8s} {adds:>5s} {r['wall']:7.2f} {cpu:>12s} {size / 1e6 / load:6.1f} "
                f"{r['main_rss'] / 1e6:8.0f} {r['worker_rss'] / 1e6:7.0f}   {ratio}"
            )
        for case, failure in failures.items():
            print(f"{path.name[:30]:30s} {case:11s} failed: {failure[:110]}")
        if "tracecal-j2" in results:
            j1, j2 = results["tracecal-j1"]["load"], results["tracecal-j2"]["load"]
            storing = results["tracecal-j1"]["store"]
            m1, m2 = results["tracecal-j1"]["median_load"], results["tracecal-j2"]["median_load"]
            b1, b2 = results["tracecal-j1"]["min_load"], results["tracecal-j2"]["min_load"]
            print(
                f"{'':30s} parse + load speed-up from 1 to 2 workers: {j1 / j2:.2f}x (least-CPU runs), "
                f"{b1 / b2:.2f}x (best wall of {repeat}: {b1:.2f} s -> {b2:.2f} s), "
                f"{m1 / m2:.2f}x (median wall: {m1:.2f} s -> {m2:.2f} s)\n{'':30s} storing the events takes "
                f"{1000 * storing:.0f} of the least-CPU -j1 run's {1000 * j1:.0f} ms (only this process stores; "
                f"with two workers, while the helper parses)\n{'':30s} on this machine now, "
                f"2 processes instead of 1: pure-Python CPU work {machine_ceiling():.2f}x, parsing these files "
                f"(no database) {parse_ceiling(files):.2f}x"
            )
    print(
        "\nhta-j1: HTA's load with use_multiprocessing=False; hta: TraceAnalysis as is (a pool of min(cores, ranks) "
        "processes).\nHTA ÷ this: tracecal-j1 against hta-j1 (hta for one rank), tracecal-j2 against hta.\n"
        "MB: uncompressed JSON. load s: parse + insert (HTA: TraceAnalysis). +dec: what decode adds to load s "
        "(wall).\ntotal s: open database + load + decode + commit. CPU s: all processes, parse + load / total.\n"
        "MB/s: MB / load s. RSS: peak MB (10^6 bytes) of the main process and of the largest worker."
    )


_TRACE_INGEST = "from tracecal.cli.ingest import main; main()"
_HTA_PROCESS = (  # what TraceAnalysis(trace_dir=...) runs, its process pool (ranks > 1) turned off; the
    # import is a TraceAnalysis user's (hta.common.trace alone imports ~0.15 s less)
    "import logging, sys; logging.disable(logging.INFO); import hta.trace_analysis; "
    "from hta.common.trace import Trace; Trace(trace_dir=sys.argv[1]).load_traces(use_multiprocessing=False)"
)


def _process_seconds(argv: list[str]) -> float | None:
    """Wall seconds of one command in a fresh process (None when it fails)."""
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False)
    return time.perf_counter() - started if done.returncode == 0 else None


def end_to_end(paths: list[Path], repeat: int, with_hta: bool) -> None:
    """``trace-ingest -j1`` into a new database vs a process loading the traces as HTA's TraceAnalysis
    does, in one process (like for like), alternated."""
    print(f"{'run':30s} {'trace-ingest -j1 s':>19s} {'HTA process s':>14s}  HTA ÷ trace-ingest (min, median)")
    for path in paths:
        files = _trace_files(path)
        with tempfile.TemporaryDirectory() as tmp:
            links = Path(tmp) / "hta"
            links.mkdir()
            for i, f in enumerate(files):
                os.symlink(f, links / f"{i}_{f.name}")
            ours: list[float] = []
            theirs: list[float | None] = []
            for _ in range(repeat):
                db = Path(tmp) / "e2e.duckdb"
                for stale in (db, db.with_name(db.name + ".wal")):
                    stale.unlink(missing_ok=True)
                argv = [sys.executable, "-c", _TRACE_INGEST, "-j", "1", "--db", str(db), str(path)]
                seconds = _process_seconds(argv)
                if seconds is None:
                    sys.exit(f"trace-ingest failed on {path}")
                ours.append(seconds)
                if with_hta:
                    theirs.append(_process_seconds([sys.executable, "-c", _HTA_PROCESS, str(links)]))
        ours.sort()
        mine = f"{ours[0]:6.2f} {ours[len(ours) // 2]:6.2f}"
        if not theirs or any(t is None for t in theirs):
            print(f"{path.name[:30]:30s} {mine:>19s} {'failed' if theirs else '':>14s}")
            continue
        hta = sorted(t for t in theirs if t is not None)
        print(
            f"{path.name[:30]:30s} {mine:>19s} {hta[0]:6.2f} {hta[len(hta) // 2]:6.2f}  "
            f"{hta[0] / ours[0]:4.2f}x {hta[len(hta) // 2] / ours[len(ours) // 2]:4.2f}x"
        )
    print(
        "\nmin and median wall of --repeat runs; trace-ingest also decodes (operators, collectives, iterations);"
        "\nthe HTA process imports hta.trace_analysis and runs what TraceAnalysis(trace_dir=...) runs, in one process:"
        "\nTrace(trace_dir=...).load_traces(use_multiprocessing=False)."
    )


def scaling(copies: int, source: Path, repeat: int) -> None:
    """1 vs 2 workers on a run of ``copies`` links to one real trace (ranks from the link names)."""
    with tempfile.TemporaryDirectory(prefix="tracecal-scaling-") as tmp:
        run = Path(tmp) / f"{copies}x_{source.name.split('.')[0]}"
        run.mkdir()
        for rank in range(copies):
            os.symlink(source.resolve(), run / f"rank-{rank}.json.gz")
        compare([run], with_hta=False, repeat=repeat)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, help="run directories or trace files")
    parser.add_argument("--no-hta", action="store_true", help="tracecal only")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; the least-CPU one is shown")
    parser.add_argument("--end-to-end", action="store_true", help="whole commands in fresh processes (see above)")
    parser.add_argument("--scaling", type=int, metavar="N", help="1 vs 2 workers on N copies of --scaling-source")
    parser.add_argument(
        "--scaling-source", type=Path, default=SHARED_KINETO / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz"
    )
    args = parser.parse_args()
    if args.runs and args.end_to_end:
        end_to_end(args.runs, args.repeat, with_hta=not args.no_hta)
    elif args.runs:
        compare(args.runs, with_hta=not args.no_hta, repeat=args.repeat)
    if args.scaling:
        scaling(args.scaling, args.scaling_source, args.repeat)
    if not args.runs and not args.scaling:
        parser.error("give run directories / trace files or --scaling N (large ranks: ingest_scale.py)")


if __name__ == "__main__":
    main()

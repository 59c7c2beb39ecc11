"""Kineto ingest speed and memory: tracecal vs HolisticTraceAnalysis, in one run.

    K=../shared/data/traces/kineto
    python benchmarks/ingest_vs_hta.py --repeat 3 $K/dlrm_8rank $K/sampled_2_of_128 $K/single/*.gz
    python benchmarks/ingest_vs_hta.py --scaling 8                 # 1 vs 2 workers on 8 copies of a 30 MB rank
    python benchmarks/ingest_vs_hta.py --stress --size-gb 1.0      # synthetic >= 1 GB rank from a real trace

For each run (a directory of rank traces, or one trace file), each case runs in a fresh Python
process (imports excluded from the timing) while a sampler thread records the RSS of the process
and of its worker processes every 10 ms:
- ``tracecal -j1``: ``ingest_runs`` with one worker into a new database — parse + load, then the
  decode step (operators, collectives, iterations) reported separately;
- ``tracecal -j2``: the same with two worker processes (runs with several files only);
- ``HTA``: ``TraceAnalysis(trace_dir=...)`` on a directory of links to the same files (HTA parses
  several ranks with a process pool of min(cores, ranks)).

Printed per case: wall seconds, MB/s of uncompressed JSON, peak RSS of the main process and of the
largest worker, and the ratio HTA / tracecal (parse + load, and end to end with decode).
``--stress`` replicates a real trace's events with shifted timestamps into one uncompressed file of at
least ``--size-gb`` GB in a temporary directory (deleted afterwards, never committed) and ingests it.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SHARED_KINETO = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "kineto"
STRESS_SOURCE = SHARED_KINETO / "single" / "a100_ddp_rank0_of_2.json.gz"
SCALING_SOURCE = SHARED_KINETO / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz"


# --- measurement in a child process -----------------------------------------------------------------


class _Usage:
    """Peak RSS of this process and of its largest descendant, and CPU seconds of the whole process
    tree, sampled every 10 ms (CPU time is the fair figure on a shared, loaded machine)."""

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.main_peak = 0
        self.worker_peak = 0
        self._child_cpu: dict[int, float] = {}
        self._own_cpu = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            self.main_peak = max(self.main_peak, self.process.memory_info().rss)
            for child in self.process.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.worker_peak = max(self.worker_peak, child.memory_info().rss)
                    times = child.cpu_times()
                    self._child_cpu[child.pid] = times.user + times.system
            self._own_cpu = time.thread_time()
            self._stop.wait(0.01)

    @property
    def cpu_seconds(self) -> float:
        """CPU of the process tree since start, less the sampler thread's own."""
        times = self.process.cpu_times()
        return times.user + times.system + sum(self._child_cpu.values()) - self._cpu_at_start - self._own_cpu

    def __enter__(self) -> _Usage:
        times = self.process.cpu_times()
        self._cpu_at_start = times.user + times.system
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _measure_tracecal(run: Path, workers: int) -> dict[str, Any]:
    import importlib

    from tracecal.ingest.pool import ParserPool
    from tracecal.sql.connection import open_database
    from tracecal.sql.load import IngestOptions, ingest_runs

    for module in (
        "tracecal.ingest.kineto",
        "tracecal.sql.decoding",
        "polars",
        "pyarrow.compute",
        "pandas",
        "pyarrow.pandas_compat",  # pyarrow imports these two on its first pa.array() of Python objects
        "pyarrow.vendored.version",
    ):
        importlib.import_module(module)  # imported before timing, as HTA's are

    from tracecal.sql import load

    decode_stored_run = load.decode_stored_run
    with tempfile.TemporaryDirectory() as tmp, _Usage() as usage:
        started = time.perf_counter()
        marks: list[tuple[float, int]] = []  # (CPU s, peak RSS so far) when open, and when decoding starts

        def mark_then_decode(*args: Any, **kwargs: Any) -> Any:
            marks.append((usage.cpu_seconds, usage.main_peak))  # parse + load (every insert) done
            return decode_stored_run(*args, **kwargs)

        load.decode_stored_run = mark_then_decode  # type: ignore[assignment]
        pool = ParserPool(workers)
        forked_at = (time.perf_counter(), usage.cpu_seconds)
        if run.is_dir():
            pool.start()  # as trace-ingest does: helpers forked before the database is opened
        fork_wall, fork_cpu = time.perf_counter() - forked_at[0], usage.cpu_seconds - forked_at[1]
        with pool, open_database(Path(tmp) / "bench.duckdb") as con:
            marks.append((usage.cpu_seconds, usage.main_peak))
            report = ingest_runs(con, [run], IngestOptions(workers=workers), pool=pool)
        wall = time.perf_counter() - started
    (result,) = report.runs
    return {
        "wall": wall,
        "load": result.load_seconds + fork_wall,  # starting the helpers is part of parse + load
        "decode": result.decode_seconds,
        "events": result.events,
        "ranks": result.ranks,
        "source_bytes": result.source_bytes,
        "cpu": usage.cpu_seconds,
        "load_cpu": marks[-1][0] - marks[0][0] + fork_cpu,
        "load_rss": marks[-1][1],
        "main_rss": usage.main_peak,
        "worker_rss": usage.worker_peak,
    }


def _measure_hta(run: Path) -> dict[str, Any]:
    import logging

    from hta.trace_analysis import TraceAnalysis

    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp, _Usage() as usage:
        for i, f in enumerate(_trace_files(run)):  # HTA reads every *.json / *.gz of one directory
            os.symlink(f, Path(tmp) / f"{i}_{f.name}")
        started = time.perf_counter()
        analysis = TraceAnalysis(trace_dir=tmp)
        wall = time.perf_counter() - started
        events = sum(len(df) for df in analysis.t.traces.values())
    return {
        "wall": wall,
        "events": events,
        "ranks": len(analysis.t.traces),
        "cpu": usage.cpu_seconds,
        "main_rss": usage.main_peak,
        "worker_rss": usage.worker_peak,
    }


def _child(case: str, run: Path) -> None:
    result = _measure_hta(run) if case == "hta" else _measure_tracecal(run, int(case.removeprefix("tracecal-j")))
    sys.stdout.write(json.dumps(result) + "\n")


def _run_child(case: str, run: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", case, str(run)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        if case == "hta":  # HTA's own failures are results too (it cannot read every trace)
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
        cases = ["tracecal-j1"] + (["tracecal-j2"] if len(files) > 1 else []) + (["hta"] if with_hta else [])
        results = {case: _best_of(case, path, repeat) for case in cases}
        hta_failure = results.pop("hta")["failed"] if "failed" in results.get("hta", {}) else None
        hta = results.get("hta")
        for case, r in results.items():
            load = r.get("load", r["wall"])
            load_cpu = r.get("load_cpu", r["cpu"])
            decode = f"{r['decode']:8.2f}" if "decode" in r else ""
            adds = f"{100 * r['decode'] / load:4.0f}%" if "decode" in r else ""
            cpu = f"{load_cpu:5.2f}/{r['cpu']:5.2f}" if "load_cpu" in r else f"{r['cpu']:5.2f}"
            ratio = ""
            if hta is not None and case != "hta":
                ratio = f"{hta['wall'] / load:5.1f}x {hta['wall'] / r['wall']:5.1f}x {hta['cpu'] / load_cpu:5.1f}x"
            print(
                f"{path.name[:30]:30s} {case:11s} {r['ranks']:5d} {r['events']:7d} {size / 1e6:6.1f} {load:7.2f} "
                f"{decode:>8s} {adds:>5s} {r['wall']:7.2f} {cpu:>12s} {size / 1e6 / load:6.1f} "
                f"{r['main_rss'] / 1e6:8.0f} {r['worker_rss'] / 1e6:7.0f}   {ratio}"
            )
        if hta_failure is not None:
            print(f"{path.name[:30]:30s} {'hta':11s} failed: {hta_failure[:110]}")
        if "tracecal-j2" in results:
            j1, j2 = results["tracecal-j1"]["load"], results["tracecal-j2"]["load"]
            m1, m2 = results["tracecal-j1"]["median_load"], results["tracecal-j2"]["median_load"]
            b1, b2 = results["tracecal-j1"]["min_load"], results["tracecal-j2"]["min_load"]
            print(
                f"{'':30s} parse + load speed-up from 1 to 2 workers: {j1 / j2:.2f}x (least-CPU runs), "
                f"{b1 / b2:.2f}x (best wall of {repeat}: {b1:.2f} s -> {b2:.2f} s), "
                f"{m1 / m2:.2f}x (median wall: {m1:.2f} s -> {m2:.2f} s); pure-Python CPU work in 2 processes "
                f"on this machine now: {machine_ceiling():.2f}x"
            )
    print(
        "\nMB: uncompressed JSON. load s: parse + insert (HTA: TraceAnalysis). +dec: what decode adds to load s "
        "(wall).\ntotal s: open database + load + decode + commit. CPU s: all processes, parse + load / total.\n"
        "MB/s: MB / load s. RSS: peak MB (10^6 bytes) of the main process and of the largest worker."
    )


def stress(size_gb: float, source: Path, keep: bool) -> None:
    """Replicate ``source``'s events with shifted timestamps into one >= size_gb GB file; ingest it."""
    import orjson

    with gzip.open(source, "rb") as handle:
        document = orjson.loads(handle.read())
    events = document.pop("traceEvents")
    stamped = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in stamped) - min(e["ts"] for e in stamped)
    head = orjson.dumps(document)[:-1] + b', "traceEvents": ['
    target = int(size_gb * 1e9)
    tmp = Path(tempfile.mkdtemp(prefix="tracecal-stress-"))
    path = tmp / "rank-0.json"
    written = 0
    started = time.perf_counter()
    with path.open("wb") as out:
        out.write(head)
        copy = 0
        while written < target:
            shift = round(copy * (span + 1000.0), 3)
            chunk = orjson.dumps([{**e, "ts": round(e["ts"] + shift, 3)} if "ts" in e else e for e in events])
            if copy:
                out.write(b",")
            out.write(chunk[1:-1])
            written += len(chunk)
            copy += 1
        out.write(b"]}")
    size = path.stat().st_size
    print(
        f"stress file: {path} {size / 1e9:.2f} GB, {copy} copies of {source.name} "
        f"({len(events) * copy:,} events), written in {time.perf_counter() - started:.0f} s"
    )
    try:
        r = _run_child("tracecal-j1", path)
        print(
            f"tracecal -j1: {r['events']:,} events; parse + load {r['load']:.1f} s wall, {r['load_cpu']:.1f} s CPU "
            f"({size / 1e6 / r['load_cpu']:.1f} MB/s per CPU second), peak RSS {r['load_rss'] / 1e9:.2f} GB "
            f"= {r['load_rss'] / size:.2f}x the file; with decode: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU, "
            f"peak RSS {r['main_rss'] / 1e9:.2f} GB"
        )
    finally:
        if not keep:
            path.unlink()
            tmp.rmdir()


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
    parser.add_argument("--stress", action="store_true", help="ingest a synthetic-from-real >= --size-gb file")
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--source", type=Path, default=STRESS_SOURCE, help="real trace replicated by --stress")
    parser.add_argument("--keep", action="store_true", help="keep the stress file")
    parser.add_argument("--scaling", type=int, metavar="N", help="1 vs 2 workers on N copies of --scaling-source")
    parser.add_argument(
        "--scaling-source", type=Path, default=SHARED_KINETO / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz"
    )
    args = parser.parse_args()
    if args.runs:
        compare(args.runs, with_hta=not args.no_hta, repeat=args.repeat)
    if args.scaling:
        scaling(args.scaling, args.scaling_source, args.repeat)
    if args.stress:
        stress(args.size_gb, args.source, args.keep)
    if not args.runs and not args.stress and not args.scaling:
        parser.error("give run directories / trace files, --scaling N or --stress")


if __name__ == "__main__":
    main()

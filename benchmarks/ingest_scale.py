"""Ingest at realistic rank sizes: MB of JSON per CPU-second and peak RSS from 0.3 to 7 GB, HTA side by
side, and 1 -> 2 workers, in one run.

    python benchmarks/ingest_scale.py                          # 0.3, 1, 3, 7 GB; HTA on 0.3 and 1 GB; 8 x 1 GB run
    python benchmarks/ingest_scale.py --sizes 0.3 1 --ranks 0  # a subset, no workers run
    python benchmarks/ingest_scale.py --sizes --rank-gb 0.3    # only the workers run, of 8 x 0.3 GB ranks
    python benchmarks/ingest_scale.py --sizes --executors local dask --rounds 3   # ratios of 3 alternated rounds

Rank files are synthetic-from-real: ``--source``'s events replicated with shifted timestamps into one
uncompressed JSON file of at least the size, made in a temporary directory under ``--tmp`` and deleted
after its case (nothing is kept). Every case runs in a fresh Python process, imports untimed; CPU
seconds and peak RSS come from the kernel's accounting (``ingest_vs_hta._Usage``):

- ``parse``: ``parse_kineto_file`` (streamed, its events spilled to the Parquet file that the event
  store keeps, as an ingest does with a rank this large);
- ``with decode``: the whole ingest of the rank, ``ingest_runs`` with one worker into a new database
  (what ``trace-ingest -j1`` runs: parse, store the events, decode, commit);
- ``HTA``: ``hta.trace_analysis.TraceAnalysis(trace_dir=...)`` on a directory holding the file, for
  the sizes of ``--hta-sizes``;
- the workers run: ``--ranks`` links to one ``--rank-gb`` GB file without ``distributedInfo`` (ranks from
  the names), ingested whole with 1 and 2 workers on the local process pool, then with ``--dask local``
  when ``trace-ingest --help`` offers it (its ``LocalCluster`` started inside the measured time), and
  with ``--dask ADDRESS`` of a ``LocalCluster`` of as many workers started before the clock starts.
  Wall time gives the speed-up. CPU counts every process of the local pool (its fork server is
  stopped and reaped at the end) and of ``--dask local``'s cluster (closed by the ingest, its workers
  reaped), not of a cluster started before the clock. ``--rounds`` repeats each executor's -j1 and -j2,
  alternated, and prints every round's ratio and their median: on a shared machine one ratio moves by
  more than a target's margin.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest_vs_hta import STRESS_SOURCE, _measure_hta, _measure_tracecal, _Usage, machine_ceiling

DEFAULT_SIZES = [0.3, 1.0, 3.0, 7.0]
DEFAULT_HTA_SIZES = [0.3, 1.0]


def make_rank_file(source: Path, size_gb: float, path: Path, *, distributed: bool = True) -> int:
    """Write ``source``'s events, replicated with shifted timestamps, into ``path`` until it holds
    at least ``size_gb`` GB; returns its size. ``distributed=False`` drops ``distributedInfo`` (the
    rank then comes from the file name)."""
    import orjson

    with gzip.open(source, "rb") as handle:
        document = orjson.loads(handle.read())
    events = document.pop("traceEvents")
    if not distributed:
        document.pop("distributedInfo", None)
    stamped = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in stamped) - min(e["ts"] for e in stamped)
    strides = _id_strides(events)
    target = int(size_gb * 1e9)
    written = 0
    with path.open("wb") as out:
        out.write(orjson.dumps(document)[:-1] + b', "traceEvents": [')
        copy = 0
        while written < target:
            shift = round(copy * (span + 1000.0), 3)
            chunk = orjson.dumps([_copied(e, copy, shift, strides) for e in events])
            out.write((b"," if copy else b"") + chunk[1:-1])
            written += len(chunk)
            copy += 1
        out.write(b"]}")
    return path.stat().st_size


ID_ARGS = (
    "correlation",
    "External id",
    "Record function id",
    "Sequence number",
    "Ev Idx",
    "Python id",
    "Python parent id",
)
"""Event args that identify an event or link two: each copy gets its own range of them, as a longer
capture would (a repeated correlation id would link every copy's kernels to the first copy's launch)."""
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _id_strides(events: list[dict[str, Any]]) -> dict[str, int]:
    """Per id arg (and ``ProfilerStep`` number, and flow ``id``), one more than its largest value."""
    strides = dict.fromkeys([*ID_ARGS, "step", "flow"], 1)
    for e in events:
        for key, value in (e.get("args") or {}).items():
            if key in strides and isinstance(value, int):
                strides[key] = max(strides[key], value + 1)
        if isinstance(e.get("id"), int):
            strides["flow"] = max(strides["flow"], e["id"] + 1)
        step = _STEP.match(str(e.get("name", "")))
        if step:
            strides["step"] = max(strides["step"], int(step.group(1)) + 1)
    return strides


def _copied(event: dict[str, Any], copy: int, shift: float, strides: dict[str, int]) -> dict[str, Any]:
    """``event`` as it appears in copy ``copy``: shifted in time, with ids and step numbers of its own."""
    if not copy:
        return event
    out = dict(event)
    if "ts" in out:
        out["ts"] = round(out["ts"] + shift, 3)
    args = out.get("args")
    if isinstance(args, dict):
        out["args"] = {k: v + copy * strides[k] if k in ID_ARGS and isinstance(v, int) else v for k, v in args.items()}
    if isinstance(out.get("id"), int):
        out["id"] += copy * strides["flow"]
    step = _STEP.match(str(out.get("name", "")))
    if step:
        out["name"] = f"ProfilerStep#{int(step.group(1)) + copy * strides['step']}"
    return out


# --- the cases, each in a fresh process ----------------------------------------------------------------


def _measure_parse(path: Path) -> dict[str, Any]:
    """Parse one rank with a spill directory (its events streamed into a Parquet file, as an ingest
    does with a rank this large: the file the event store keeps)."""
    from tracecal.ingest.trace import EventsFile
    from tracecal.sources.kineto.parser import parse_kineto_file

    with tempfile.TemporaryDirectory(prefix="tracecal-scale-", dir=path.parent) as tmp:
        usage = _Usage()
        started = time.perf_counter()
        parsed = parse_kineto_file(path, Path(tmp))
        events = parsed.events
        return {
            "events": events.rows if isinstance(events, EventsFile) else events.num_rows,
            "cpu": usage.cpu_seconds(),
            "wall": time.perf_counter() - started,
            "rss": usage.main_peak(),
        }


def _measure_on_running_cluster(path: Path, workers: int) -> dict[str, Any]:
    """The whole ingest with ``--dask ADDRESS``: a ``LocalCluster`` of ``workers`` single-threaded
    worker processes (as ``--dask local`` makes) started first and untimed, as a cluster a user
    keeps running between ingests is."""
    import dask
    import distributed

    from tracecal.ingest.dask_cluster import LOCAL_CLUSTER_CONFIG

    with dask.config.set(LOCAL_CLUSTER_CONFIG):
        cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
    try:
        return _measure_tracecal(path, workers, cluster.scheduler_address)
    finally:
        cluster.close()


def _child(case: str, path: Path) -> None:
    if case == "parse":
        result = _measure_parse(path)
    elif case == "hta":
        result = _measure_hta(path, one_process=False)
    elif case.endswith("-dask-up"):  # ingest-jN-dask-up: --dask ADDRESS of a cluster already running
        result = _measure_on_running_cluster(path, int(case.removeprefix("ingest-j").removesuffix("-dask-up")))
    else:  # ingest-jN or ingest-jN-dask
        workers = int(case.removeprefix("ingest-j").removesuffix("-dask"))
        result = _measure_tracecal(path, workers, "local" if case.endswith("-dask") else None)
    sys.stdout.write(json.dumps(result) + "\n")


def _run_child(case: str, path: Path) -> dict[str, Any]:
    """One case in a fresh process; ``{"failed": last line of its error}`` when it fails."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", case, str(path)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines() or [f"exit status {out.returncode}"]
        return {"failed": lines[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- the tables -----------------------------------------------------------------------------------------


def _peak(r: dict[str, Any]) -> float:
    return max(r.get("rss", 0), r.get("main_rss", 0), r.get("worker_rss", 0)) / 1e9


def sizes_table(sizes: list[float], hta_sizes: list[float], source: Path, tmp: Path) -> None:
    print(
        f"{'rank':>8s} {'events':>11s} | {'parse':>10s} {'MB/s/CPU-s':>10s} {'peak RSS':>8s} | "
        f"{'with decode':>11s} {'MB/s/CPU-s':>10s} {'vs 1st':>6s} {'÷ parse':>7s} {'peak RSS':>8s} {'wall s':>7s} "
        f"{'load':>5s}"
    )
    base: float | None = None
    hta_lines = []
    for size_gb in sizes:
        run = tmp / f"rank_{size_gb:g}GB"
        run.mkdir()
        path = run / "rank-0.json"
        size = make_rank_file(source, size_gb, path)
        mb = size / 1e6
        load_average = os.getloadavg()[0]
        parse = _run_child("parse", path)
        whole = _run_child("ingest-j1", path)
        for label, r in (("parse", parse), ("with decode", whole)):
            if "failed" in r:
                sys.exit(f"{label} of the {size / 1e9:.2f} GB rank failed: {r['failed']}")
        rate = mb / whole["cpu"]
        base = base or rate
        parse_rate = mb / parse["cpu"]
        print(
            f"{size / 1e9:5.2f} GB {parse['events']:>11,} | {parse['cpu']:8.1f} s "
            f"{parse_rate:10.1f} {_peak(parse):5.2f} GB | {whole['cpu']:9.1f} s {rate:10.1f} "
            f"{100 * (rate / base - 1):+5.0f}% {rate / parse_rate:7.2f} {_peak(whole):5.2f} GB {whole['wall']:7.1f} "
            f"{load_average:5.1f}",
            flush=True,
        )
        if any(abs(size_gb - h) < 1e-9 for h in hta_sizes):
            h = _run_child("hta", run)
            if "failed" in h:
                hta_lines.append(f"{size / 1e9:5.2f} GB  HTA failed: {h['failed'][:100]}")
            else:
                hta_lines.append(
                    f"{size / 1e9:5.2f} GB {h['events']:>11,} | {h['cpu']:8.1f} s {mb / h['cpu']:10.1f} "
                    f"{_peak(h):5.2f} GB | {h['cpu'] / parse['cpu']:8.1f}x {h['cpu'] / whole['cpu']:10.1f}x "
                    f"{_peak(h) / _peak(whole):9.1f}x"
                )
        shutil.rmtree(run)
    print(
        "MB/s/CPU-s: MB of JSON per CPU-second (every process); parse: the parse alone (its events spilled to\n"
        "the Parquet file the event store keeps); peak RSS: the largest process; with decode: the whole ingest\n"
        "(parse, store, decode, commit); vs 1st: its\n"
        "MB/s per CPU-second against the first size; ÷ parse: against the parse alone; load: load average before"
    )
    if hta_lines:
        print(
            f"\n{'rank':>8s} {'HTA rows':>11s} | {'HTA CPU':>10s} {'MB/s/CPU-s':>10s} {'peak RSS':>8s} | "
            f"{'HTA CPU ÷ parse':>15s} {'÷ with decode':>13s} {'RSS ÷ ours':>10s}"
        )
        print("\n".join(hta_lines))
        print("HTA: TraceAnalysis(trace_dir=...) on the same file, its rows the DataFrame's (every event kept)")


def _dask_offered() -> str | None:
    """None when ``trace-ingest --help`` shows ``--dask``, else why the Dask case is skipped."""
    out = subprocess.run(
        [sys.executable, "-c", "from tracecal.cli.ingest import main; main()", "--help"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    return None if "--dask" in out.stdout else "trace-ingest has no --dask option here"


EXECUTORS = {
    "local": ("local", ""),
    "dask": ("dask local", "-dask"),
    "dask-up": ("dask ADDRESS (cluster up)", "-dask-up"),
}
"""``--executors`` choices: the name printed and the child case's suffix."""


def workers_table(ranks: int, size_gb: float, source: Path, tmp: Path, executors: list[str], rounds: int) -> None:
    run = tmp / f"{ranks}x{size_gb:g}GB"
    run.mkdir()
    one = tmp / "one_rank.json"
    size = make_rank_file(source, size_gb, one, distributed=False)
    for rank in range(ranks):
        os.symlink(one, run / f"rank-{rank}.json")
    total_mb = ranks * size / 1e6
    skip = _dask_offered() if any(e != "local" for e in executors) else None
    chosen = [EXECUTORS[e] for e in executors if e == "local" or skip is None]
    ratios: dict[str, list[float]] = {name: [] for name, _ in chosen}
    # Round by round, each executor's -j1 then -j2, so that a slow spell of the machine falls on both
    # halves of a ratio rather than on one executor.
    for round_ in range(1, rounds + 1):
        for name, suffix in chosen:
            results = {j: _run_child(f"ingest-j{j}{suffix}", run) for j in (1, 2)}
            failed = [f"-j{j}: {r['failed'][:120]}" for j, r in results.items() if "failed" in r]
            label = f"{name} (round {round_})" if rounds > 1 else name
            if failed:
                print(f"{label}: failed ({'; '.join(failed)})", flush=True)
                continue
            for j, r in results.items():
                cpu = f"{r['cpu']:.1f} CPU-s ({total_mb / r['cpu']:.1f} MB/s per CPU-s), loader's {r['load_cpu']:.1f}"
                if suffix == "-dask-up":  # the cluster outlives the case: its workers are not reaped in it
                    cpu = "CPU not counted"
                print(
                    f"{label} -j{j}: {ranks} x {size / 1e9:.2f} GB: {r['wall']:.1f} s wall, {cpu}; "
                    f"peak RSS main {r['main_rss'] / 1e9:.2f} GB, largest worker {r['worker_rss'] / 1e9:.2f} GB; "
                    f"load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            ratios[name].append(results[1]["wall"] / results[2]["wall"])
            print(f"{label} 1 -> 2 workers: {ratios[name][-1]:.2f}x (wall, whole ingest)", flush=True)
    if rounds > 1:
        for name, values in ratios.items():
            listed = ", ".join(f"{v:.2f}" for v in values)
            if values:
                median = statistics.median(values)
                print(f"{name} 1 -> 2 workers over {len(values)} rounds: {listed}; median {median:.2f}x")
    if skip is not None:
        print(f"dask: skipped ({skip})")
    print(f"two processes of pure-Python work on this machine now: {machine_ceiling():.2f}x")
    shutil.rmtree(run)
    one.unlink()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="*", default=DEFAULT_SIZES, help="rank sizes, GB")
    parser.add_argument("--hta-sizes", type=float, nargs="*", default=DEFAULT_HTA_SIZES, help="of --sizes, run HTA on")
    parser.add_argument("--ranks", type=int, default=8, help="ranks of the 1 -> 2 workers run (0: none)")
    parser.add_argument("--rank-gb", type=float, default=1.0, help="size of each rank of that run")
    parser.add_argument(
        "--executors", nargs="+", choices=list(EXECUTORS), default=list(EXECUTORS), help="of the workers run"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="workers run: times each executor's -j1 and -j2 are run, alternated"
    )
    parser.add_argument("--source", type=Path, default=STRESS_SOURCE, help="real trace the files replicate")
    parser.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="where the files are made")
    args = parser.parse_args()
    free = shutil.disk_usage(args.tmp).free / 1e9
    need = max([*args.sizes, args.rank_gb if args.ranks else 0.0]) * 1.3
    print(
        f"{free:.0f} GB free in {args.tmp}; the largest case needs about {need:.1f} GB (JSON, spill, database); "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; peak RSS of this process so far "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB",
        flush=True,
    )
    if free < need:
        sys.exit(f"not enough space in {args.tmp}: pass --tmp on a larger filesystem")
    with tempfile.TemporaryDirectory(prefix="tracecal-scale-", dir=args.tmp) as tmp:
        if args.sizes:
            sizes_table(args.sizes, args.hta_sizes, args.source, Path(tmp))
        if args.ranks:
            print()
            workers_table(args.ranks, args.rank_gb, args.source, Path(tmp), args.executors, max(1, args.rounds))


if __name__ == "__main__":
    main()

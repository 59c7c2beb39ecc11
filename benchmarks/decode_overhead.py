"""How much decoding adds to ingest: ingest-only vs ingest+decode on the shared traces, side by side.

Usage: python benchmarks/decode_overhead.py [--repeats 3] [--workers 1] [--cold] [--baseline SRC] [EXTRA_RUN_DIR ...]

"ingest-only" runs the real loader with its decode step replaced by a no-op; "ingest+decode" runs it
unchanged (so decode's figure includes storing and committing its rows). The two alternate; each is
the best of --repeats runs into a fresh database, timed both as wall time and as
this process's CPU time (all threads): on a shared machine the CPU time is the stable figure, wall
time moves with other people's load. Target (issue 3): decode adds at most 50 %.

By default every ingest runs in this process after a warm-up ingest of the same run (what a
process ingesting many runs sees: regexes compiled, caches filled). ``--cold`` runs each ingest in
a fresh Python process instead, imports excluded from the timing, as ``trace-ingest`` and
``benchmarks/ingest_vs_hta.py`` do: first-use costs (polars compiling regexes, code paged in) count.

``--baseline SRC`` also measures another tracecal source tree (a directory holding a ``tracecal``
package, e.g. ``git worktree add /tmp/base <commit>``), interleaved with this one repeat by repeat so
both see the same load: every ingest then runs in a child process (after a warm-up ingest in that
child unless ``--cold``), and the decode's added CPU seconds of both are printed side by side.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from tracecal.pipeline import ingest as pipeline_ingest
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sql.connection import open_database

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
RUNS = [
    SHARED / "kineto" / "dlrm_8rank",
    SHARED / "kineto" / "sampled_2_of_128",
    SHARED / "kineto" / "single" / "a100_ddp_rank0_of_2.json.gz",
    SHARED / "kineto" / "single" / "cpu_gloo_rank-34_of_300.pt.trace.json.gz",
    SHARED / "kineto" / "single" / "h100_bert_small_inference.json.gz",
    SHARED / "kineto" / "single" / "mi300x_ddp_resnet_rank0_of_8.json.gz",
    SHARED / "kineto" / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz",
    SHARED / "nsys" / "mfu_2gpu_after.sqlite.gz",
]


def _ingest(run: Path, workers: int, decode: bool, cold: bool = False) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ingest into a fresh database (``cold``: in a new process)."""
    if cold:
        return _in_child(run, workers, decode, warm_up=False, src=None)
    with tempfile.TemporaryDirectory() as tmp, open_database(Path(tmp) / "b.duckdb") as con:
        wall, cpu = time.perf_counter(), time.process_time()
        if decode:
            ingest_runs(con, [run], IngestOptions(workers=workers))
        else:
            with mock.patch.object(pipeline_ingest, "decode_stored_run", lambda *a, **k: None):
                ingest_runs(con, [run], IngestOptions(workers=workers))
        return time.perf_counter() - wall, time.process_time() - cpu


def _prepare_parsing_process() -> None:
    """Before a child's timed ingest: a ``--baseline`` tree with ``tracecal.ingest.no_pandas`` keeps
    pandas out of pyarrow, as its trace-ingest did; any other tree (this one too: no_pandas is gone)
    gets pandas imported here, so that pyarrow's first probe for it (on its first ``pa.array``) is an
    import, kept out of the timing like the others."""
    try:
        from tracecal.ingest.no_pandas import keep_pandas_out_of_pyarrow
    except ImportError:
        importlib.import_module("pandas")
        return
    keep_pandas_out_of_pyarrow()


def _import_kineto_parser() -> None:
    """Import the tree's Kineto parser: ``tracecal.ingest.kineto`` in a ``--baseline`` tree from before
    the sources packages, else ``tracecal.sources.kineto.parser``. The old name is tried first: the
    editable install would find the new one in this checkout even for a baseline tree that lacks it."""
    try:
        importlib.import_module("tracecal.ingest.kineto")
    except ModuleNotFoundError:
        importlib.import_module("tracecal.sources.kineto.parser")


def _in_child(run: Path, workers: int, decode: bool, warm_up: bool, src: Path | None) -> tuple[float, float]:
    """(wall, CPU) seconds of one ingest in a new process; ``src``: import tracecal from there."""
    flags = (["--decode"] if decode else []) + (["--warm-up"] if warm_up else [])
    argv = [sys.executable, __file__, "--child", str(run), "--workers", str(workers), *flags]
    env = {**os.environ, "PYTHONPATH": str(src)} if src is not None else None
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env).stdout
    wall, cpu = (float(x) for x in out.split())
    return wall, cpu


def _versus(runs: list[Path], args: argparse.Namespace) -> None:
    """This tree and ``args.baseline`` side by side, interleaved, every ingest in a child process."""
    import tracecal

    sources = {"baseline": args.baseline, "this": Path(tracecal.__file__).resolve().parents[1]}
    print(f"baseline: {args.baseline}; this: {sources['this']}")
    head = f"{'run':32} {'tree':8} {'CPU: ingest':>11} {'+ decode':>9} {'decode':>7} {'adds':>6}   {'wall: adds':>10}"
    print(head)
    print("-" * len(head))
    added = {name: 0.0 for name in sources}
    for run in runs:
        best: dict[tuple[str, bool], list[tuple[float, float]]] = {}
        for _ in range(args.repeats):
            for name, src in sources.items():
                for decode in (False, True):
                    result = _in_child(run, args.workers, decode, warm_up=not args.cold, src=src)
                    best.setdefault((name, decode), []).append(result)
        for name in sources:
            w0, w1 = (min(r[0] for r in best[(name, d)]) for d in (False, True))
            c0, c1 = (min(r[1] for r in best[(name, d)]) for d in (False, True))
            added[name] += c1 - c0
            cpu = f"{c0:11.3f} {c1:9.3f} {c1 - c0:7.3f} {_pct(c0, c1):>6}"
            print(f"{run.name[:32]:32} {name:8} {cpu}   {_pct(w0, w1):>10}")
    print("decode CPU seconds added, all traces: " + ", ".join(f"{n} {s:.3f}" for n, s in added.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--cold", action="store_true", help="each ingest in a fresh process (imports not timed)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--decode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warm-up", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=Path, help="another tracecal source tree to compare with, interleaved")
    parser.add_argument("extra", nargs="*", type=Path, help="more run directories (e.g. a tracecal workload run)")
    args = parser.parse_args()
    if args.child is not None:  # one timed ingest for --cold, imported first as ingest_vs_hta.py does
        _prepare_parsing_process()
        importlib.import_module("pyarrow.compute")
        _import_kineto_parser()
        if args.warm_up:
            _ingest(args.child, args.workers, True)
        print(*_ingest(args.child, args.workers, args.decode))
        return
    if args.baseline is not None:
        _versus([*RUNS, *args.extra], args)
        return
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; workers={args.workers}")
    print(f"{'cold: each ingest in a new process' if args.cold else 'warm: after a warm-up ingest'}; ", end="")
    print(f"best of {args.repeats}, seconds; 'decode adds' = (ingest + decode) / ingest - 1; target <= 50 % per trace")
    head = f"{'run':32} {'CPU: ingest':>11} {'+ decode':>9} {'adds':>6}   {'wall: ingest':>12} {'+ decode':>9}"
    head += f" {'adds':>6}"
    print(head)
    print("-" * len(head))
    totals = [0.0, 0.0, 0.0, 0.0]
    met = 0
    runs = [*RUNS, *args.extra]
    for run in runs:
        _ingest(run, args.workers, True)  # warm the page cache and imports
        plain, full = [], []
        for _ in range(args.repeats):  # alternated, so a burst of load from other jobs hits both sides
            plain.append(_ingest(run, args.workers, False, args.cold))
            full.append(_ingest(run, args.workers, True, args.cold))
        w0, w1 = min(p[0] for p in plain), min(f[0] for f in full)
        c0, c1 = min(p[1] for p in plain), min(f[1] for f in full)
        totals = [t + f for t, f in zip(totals, (c0, c1, w0, w1), strict=True)]
        met += c1 / c0 - 1 <= 0.5
        print(f"{run.name[:32]:32} {c0:11.3f} {c1:9.3f} {_pct(c0, c1):>6}   {w0:12.3f} {w1:9.3f} {_pct(w0, w1):>6}")
    c0, c1, w0, w1 = totals
    print(f"{'all':32} {c0:11.3f} {c1:9.3f} {_pct(c0, c1):>6}   {w0:12.3f} {w1:9.3f} {_pct(w0, w1):>6}")
    print(f"decode adds <= 50 % of CPU on {met} of {len(runs)} traces")


def _pct(base: float, total: float) -> str:
    return f"{(total / base - 1) * 100:+.0f}%"


if __name__ == "__main__":
    main()

"""How much decoding adds to ingest: ingest-only vs ingest+decode on the shared traces, side by side.

Usage: python benchmarks/decode_overhead.py [--repeats 3] [--workers 1] [--cold] [EXTRA_RUN_DIR ...]

"ingest-only" runs the real loader with its decode step replaced by a no-op; "ingest+decode" runs it
unchanged (so decode's figure includes storing and committing its rows). The two alternate; each is
the best of --repeats runs into a fresh database, timed both as wall time and as
this process's CPU time (all threads): on a shared machine the CPU time is the stable figure, wall
time moves with other people's load. Target (issue 3): decode adds at most 50 %.

By default every ingest runs in this process after a warm-up ingest of the same run (what a
process ingesting many runs sees: regexes compiled, caches filled). ``--cold`` runs each ingest in
a fresh Python process instead, imports excluded from the timing, as ``trace-ingest`` and
``benchmarks/ingest_vs_hta.py`` do: first-use costs (polars compiling regexes, code paged in) count.
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

from tracecal.sql import load
from tracecal.sql.connection import open_database
from tracecal.sql.load import IngestOptions, ingest_runs

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
        flag = ["--decode"] if decode else []
        argv = [sys.executable, __file__, "--child", str(run), "--workers", str(workers), *flag]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        wall, cpu = (float(x) for x in out.split())
        return wall, cpu
    with tempfile.TemporaryDirectory() as tmp, open_database(Path(tmp) / "b.duckdb") as con:
        wall, cpu = time.perf_counter(), time.process_time()
        if decode:
            ingest_runs(con, [run], IngestOptions(workers=workers))
        else:
            with mock.patch.object(load, "decode_stored_run", lambda *a, **k: None):
                ingest_runs(con, [run], IngestOptions(workers=workers))
        return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--cold", action="store_true", help="each ingest in a fresh process (imports not timed)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--decode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", type=Path, help="more run directories (e.g. a tracecal workload run)")
    args = parser.parse_args()
    if args.child is not None:  # one timed ingest for --cold, imported first as ingest_vs_hta.py does
        for module in ("tracecal.ingest.kineto", "pyarrow.compute", "pandas", "pyarrow.pandas_compat"):
            importlib.import_module(module)
        print(*_ingest(args.child, args.workers, args.decode))
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

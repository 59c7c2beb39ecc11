"""How much decoding adds to ingest: ingest-only vs ingest+decode on the shared traces, side by side.

Usage: python benchmarks/decode_overhead.py [--repeats 3] [--workers 1] [EXTRA_RUN_DIR ...]

"ingest-only" runs the real loader with its decode step replaced by a no-op; "ingest+decode" runs it
unchanged (so decode's figure includes storing and committing its rows). The two alternate; each is
the best of --repeats runs into a fresh database, timed both as wall time and as
this process's CPU time (all threads): on a shared machine the CPU time is the stable figure, wall
time moves with other people's load. Target (issue 3): decode adds at most 50 %.
"""

from __future__ import annotations

import argparse
import os
import platform
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
    SHARED / "kineto" / "single" / "mi300x_ddp_resnet_rank0_of_8.json.gz",
    SHARED / "kineto" / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz",
    SHARED / "nsys" / "mfu_2gpu_after.sqlite.gz",
]


def _ingest(run: Path, workers: int, decode: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ingest into a fresh database."""
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
    parser.add_argument("extra", nargs="*", type=Path, help="more run directories (e.g. a tracecal workload run)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; workers={args.workers}")
    head = f"{'run':32} {'wall: ingest s':>14} {'+decode s':>10} {'ratio':>6}   {'CPU: ingest s':>13}"
    print(f"{head} {'+decode s':>10} {'ratio':>6}")
    totals = [0.0, 0.0, 0.0, 0.0]
    for run in [*RUNS, *args.extra]:
        _ingest(run, args.workers, True)  # warm the page cache and imports
        plain, full = [], []
        for _ in range(args.repeats):  # alternated, so a burst of load from other jobs hits both sides
            plain.append(_ingest(run, args.workers, False))
            full.append(_ingest(run, args.workers, True))
        figures = [min(p[0] for p in plain), min(f[0] for f in full), min(p[1] for p in plain), min(f[1] for f in full)]
        totals = [t + f for t, f in zip(totals, figures, strict=True)]
        w0, w1, c0, c1 = figures
        print(f"{run.name[:32]:32} {w0:14.3f} {w1:10.3f} {w1 / w0:6.2f}   {c0:13.3f} {c1:10.3f} {c1 / c0:6.2f}")
    w0, w1, c0, c1 = totals
    print(f"{'all':32} {w0:14.3f} {w1:10.3f} {w1 / w0:6.2f}   {c0:13.3f} {c1:10.3f} {c1 / c0:6.2f}")


if __name__ == "__main__":
    main()

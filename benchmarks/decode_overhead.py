"""How much decoding adds to ingest: ingest-only vs ingest+decode on the shared traces, side by side.

Usage: python benchmarks/decode_overhead.py [--repeats 3] [--workers 1] [EXTRA_RUN_DIR ...]

"ingest-only" runs the real loader with its decode step replaced by a no-op; "ingest+decode" runs it
unchanged. Each is the best of --repeats runs into a fresh database. The decode share is also taken
from DecodeSummary.seconds inside the full run. Target (issue 3): decode adds at most 50 %.
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


def _ingest(run: Path, workers: int, decode: bool) -> tuple[float, float | None]:
    with tempfile.TemporaryDirectory() as tmp, open_database(Path(tmp) / "b.duckdb") as con:
        started = time.perf_counter()
        if decode:
            report = ingest_runs(con, [run], IngestOptions(workers=workers))
        else:
            with mock.patch.object(load, "decode_stored_run", lambda *a, **k: None):
                report = ingest_runs(con, [run], IngestOptions(workers=workers))
        total = time.perf_counter() - started
    d = report.runs[0].decode
    return total, (d.seconds if d is not None else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("extra", nargs="*", type=Path, help="more run directories (e.g. a tracecal workload run)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}; workers={args.workers}")
    print(
        f"{'run':32} {'ingest-only s':>14} {'ingest+decode s':>16} {'ratio':>7} {'decode s':>9} {'decode/ingest':>14}"
    )
    tot_plain = tot_full = tot_dec = 0.0
    for run in [*RUNS, *args.extra]:
        _ingest(run, args.workers, True)  # warm the page cache and imports
        plain = min(_ingest(run, args.workers, False)[0] for _ in range(args.repeats))
        fulls = [_ingest(run, args.workers, True) for _ in range(args.repeats)]
        full, dec = min(fulls, key=lambda x: x[0])
        dec = dec or 0.0
        tot_plain += plain
        tot_full += full
        tot_dec += dec
        print(
            f"{run.name[:32]:32} {plain:14.3f} {full:16.3f} {full / plain:7.2f} {dec:9.3f} {dec / (full - dec):14.2f}"
        )
    print(
        f"{'all':32} {tot_plain:14.3f} {tot_full:16.3f} {tot_full / tot_plain:7.2f} {tot_dec:9.3f} "
        f"{tot_dec / (tot_full - tot_dec):14.2f}"
    )


if __name__ == "__main__":
    main()

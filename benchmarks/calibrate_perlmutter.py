"""Time `calibrate --cluster perlmutter` end to end on the published Perlmutter samples.

Imports ``../shared/data/gpumodeling25/samples/perlmutter_a100_{compute,nccl}`` into a fresh database,
then runs the real console script (a subprocess, so imports and start-up count) and prints, in one run:
wall time against the 5-minute budget (SPEC/issue 6), CPU time, and our hold-out errors against the
published ones from the report it wrote, and the per-file NCCL table (with each sweep's noise level
and status). Usage::

    python benchmarks/calibrate_perlmutter.py [--keep DIR] [--family comm]

``--family comm`` calibrates the collectives only (about a third of the time: for iterating on the
NCCL models; the budget line then does not apply).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO.parent / "shared" / "data" / "gpumodeling25" / "samples"
BUDGET_S = 300.0


def run(args: list[str]) -> tuple[float, float]:
    """Run a command; return (wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="keep the database, model store and report in this directory")
    parser.add_argument("--family", help="calibrate only this family (e.g. comm)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="tracecal-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "perlmutter.duckdb"
    report = work / "report.csv"
    for stale in (db, work / "perlmutter.models"):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    dirs = [SAMPLES / "perlmutter_a100_compute", SAMPLES / "perlmutter_a100_nccl"]
    bindir = Path(sys.executable).parent
    tracecal = shutil.which("tracecal", path=str(bindir)) or "tracecal"
    calibrate = shutil.which("calibrate", path=str(bindir)) or "calibrate"

    import_wall = import_cpu = 0.0
    for d in dirs:
        wall, cpu = run([tracecal, "samples", "import", str(d), "--cluster", "perlmutter", "--db", str(db)])
        import_wall += wall
        import_cpu += cpu
    command = [calibrate, "--cluster", "perlmutter", "--db", str(db), "--report", str(report)]
    for d in dirs:
        command += ["--published", str(d)]
    if args.family:
        command += ["--family", args.family]
    wall, cpu = run(command)

    table = pl.read_csv(report)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    print(f"import published samples      {import_wall:7.1f} s wall  {import_cpu:7.1f} s CPU")
    print(f"calibrate --cluster perlmutter {wall:7.1f} s wall  {cpu:7.1f} s CPU  ({len(table)} model groups)")
    print(f"calibrate / 5-minute budget    {wall / BUDGET_S:7.2f}x")
    for scope, part in (
        ("compute", table.filter(pl.col("family") != "comm")),
        ("comm", table.filter(pl.col("family") == "comm")),
    ):
        both = part.filter(pl.col("published_mape").is_not_null() & pl.col("mape").is_not_null())
        if both.height == 0:
            continue
        ours = both["mape"].median()
        theirs = both["published_mape"].median()
        lower = both.filter(pl.col("mape") < pl.col("published_mape")).height
        print(
            f"{scope:8s} median hold-out MAPE ours {ours:6.2f} %  published {theirs:6.2f} %  "
            f"ours/published {ours / theirs:5.2f}x  lower on {lower}/{both.height}"
        )
    comm = table.filter(pl.col("family") == "comm")
    consistent = comm.filter(pl.col("status") == "ok")
    if consistent.height:
        print(
            f"comm     self-consistent files {consistent.height}/{comm.height}: worst hold-out MAPE "
            f"{consistent['mape'].max():.2f} % (bar 5 %), lower than published on "
            f"{consistent.filter(pl.col('mape') < pl.col('published_mape')).height}"
        )
    print(f"{'collective x topology':24s} {'model':14s} {'train/test':>10s} {'excl':>4s} {'MAPE %':>7s} "
          f"{'published':>9s} {'noise %':>7s}  status")  # fmt: skip
    for r in comm.sort("op").iter_rows(named=True):
        if r["mape"] is None:  # no model (too few usable samples): the status says why
            print(f"{r['op']:24s} {'-':14s} {r['excluded']:>16d} {'':>26s}  {r['status']}")
            continue
        mark = "+" if r["published_mape"] is not None and r["mape"] < r["published_mape"] else " "
        published = "" if r["published_mape"] is None else f"{r['published_mape']:.2f}"
        print(
            f"{r['op']:24s} {r['model']:14s} {r['n_train']:>5d}/{r['n_test']:<4d} {r['excluded']:>4d} "
            f"{r['mape']:6.2f}{mark} {published:>9s} {r['noise_ape']:7.2f}  {r['status'].split(':')[0]}"
        )
    print(f"artifacts in {work}")


if __name__ == "__main__":
    main()

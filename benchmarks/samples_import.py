"""Sample import speed: each step of `tracecal samples import` next to a bare CSV read, in one run.

    python benchmarks/samples_import.py              # the published Perlmutter compute + NCCL CSVs
    python benchmarks/samples_import.py --repeat 3

Steps, each timed ``--repeat`` times (best run reported), over both Perlmutter directories:
- ``read csv``: ``polars.read_csv`` of every sample CSV (the floor: bytes to a frame, no mapping);
- ``load``: ``load_gpumodeling25`` — parse, validate, map each row to family and shape features;
- ``flag``: ``quality.flag_samples`` on the loaded rows;
- ``write``: ``write_samples`` into a fresh database (one transaction);
- ``export`` / ``import parquet``: ``export_parquet`` and ``import_parquet`` into another database.

Prints wall and CPU seconds, samples/s and each step's wall time relative to ``read csv``. On a
shared machine compare the CPU seconds too.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from tracecal.samplers.quality import flag_samples
from tracecal.sources.gpumodeling25.samples.importer import load_gpumodeling25
from tracecal.sql.connection import open_database
from tracecal.sql.samples import export_parquet, import_parquet, write_samples

SAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gpumodeling25" / "samples"
DIRS = [SAMPLES / "perlmutter_a100_compute", SAMPLES / "perlmutter_a100_nccl"]


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """(best wall s, CPU s of that run, result)."""
    runs = []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        runs.append((time.perf_counter() - wall, time.process_time() - cpu, result))
    return min(runs, key=lambda r: r[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    files = [p for d in DIRS for p in sorted(d.glob("*_fp16*.csv"))]
    size_mb = sum(p.stat().st_size for p in files) / 1e6

    results: list[tuple[str, float, float]] = []
    wall, cpu, _ = best(lambda: [pl.read_csv(p) for p in files], args.repeat)
    results.append(("read csv", wall, cpu))
    wall, cpu, tables = best(lambda: [load_gpumodeling25(d, "perlmutter") for d in DIRS], args.repeat)
    results.append(("load", wall, cpu))
    frame = pl.concat([pl.from_arrow(t) for t in tables])  # type: ignore[misc]
    assert isinstance(frame, pl.DataFrame)
    wall, cpu, flagged = best(lambda: flag_samples(frame), args.repeat)
    results.append(("flag", wall, cpu))
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(1000))

        def write() -> None:
            with open_database(Path(tmp) / f"w{next(counter)}.duckdb") as con:
                write_samples(con, flagged.to_arrow())

        wall, cpu, _ = best(write, args.repeat)
        results.append(("write", wall, cpu))
        out = Path(tmp) / "samples.parquet"
        with open_database(Path(tmp) / "w0.duckdb", read_only=True) as con:
            wall, cpu, _ = best(lambda: export_parquet(con, out), args.repeat)
        results.append(("export", wall, cpu))

        def reimport() -> None:
            with open_database(Path(tmp) / f"r{next(counter)}.duckdb") as con:
                import_parquet(con, out)

        wall, cpu, _ = best(reimport, args.repeat)
        results.append(("import parquet", wall, cpu))
        parquet_mb = out.stat().st_size / 1e6

    n = frame.height
    load = os.getloadavg()[0]
    print(f"{platform.node()}: {os.cpu_count()} CPUs, python {platform.python_version()}, load {load:.1f}")
    print(f"{len(files)} CSV files, {size_mb:.1f} MB -> {n} samples; Parquet export {parquet_mb:.1f} MB")
    floor = results[0][1]
    print(f"{'step':<16}{'wall s':>9}{'cpu s':>9}{'samples/s':>12}{'x read csv':>12}")
    for name, wall, cpu in results:
        print(f"{name:<16}{wall:>9.2f}{cpu:>9.2f}{n / wall:>12.0f}{wall / floor:>12.1f}")


if __name__ == "__main__":
    main()

"""The calibrated Perlmutter models on the real A100 kernels of the published GPT-NeoX runs, per family.

Reads every ``runs/perlmutter/*/*/{0,1,2}/encoder_{fwd,bwd}.csv`` of ``../shared/data/gpumodeling25``
(one encoder layer forward and backward, per pipeline rank, as the published decoder extracted it),
turns each kernel row into an ``operators``-like row (the innermost CPU op ``cpu_op_1`` with its Input
Dims; the tables lost ``Input type``, the runs are fp16, so every tensor is ``c10::Half``), derives
families and shapes with ``tracecal.decode.shape_features.family_shape_table``, flags the rows whose CPU op
and kernel disagree with ``tracecal.decode.consistency.misaligned_ops`` and drops them, sums the
kernels of each CPU operator (``tracecal.calibrate.in_trace.per_operator``), predicts each operator
once with ``tracecal.open(db).models(cluster).predict`` and prints, per family: kernels, operators,
share of measured time, coverage, MAPE, median APE and the time-weighted error of the covered
operators. Usage::

    python benchmarks/in_trace_published.py [--db DB] [--unsampled uncovered|baseline] [--worst 3]

Without ``--db`` the published Perlmutter samples are imported into a temporary database and
``calibrate --cluster perlmutter`` runs first (about two minutes on two cores).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from tracecal.api import Session
from tracecal.calibrate.in_trace import per_operator
from tracecal.decode.consistency import misaligned_ops
from tracecal.decode.shape_features import family_shape_table
from tracecal.sources.gpumodeling25.read.decoded_run import activity_kind, read_kernel_table
from tracecal.sources.gpumodeling25.rebuild.rebuilt_trace import types_for

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "gpumodeling25"
CLUSTER = "perlmutter"
HALF = "c10::Half"
FAMILIES = ("gemm", "attention", "softmax", "norm", "elementwise", "other", "memcpy", "comm")


def calibrated_db() -> Path:
    """A fresh database with the published samples imported and calibrated."""
    work = Path(tempfile.mkdtemp(prefix="tracecal-intrace-"))
    db = work / "perlmutter.duckdb"
    bindir = Path(sys.executable).parent
    tracecal = shutil.which("tracecal", path=str(bindir)) or "tracecal"
    calibrate = shutil.which("calibrate", path=str(bindir)) or "calibrate"
    for d in ("perlmutter_a100_compute", "perlmutter_a100_nccl"):
        subprocess.run(
            [tracecal, "samples", "import", str(DATA / "samples" / d), "--cluster", CLUSTER, "--db", str(db),
             "--format", "gpumodeling25"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    subprocess.run([calibrate, "--cluster", CLUSTER, "--db", str(db)], check=True, stdout=subprocess.DEVNULL)
    return db


def read_tables() -> pl.DataFrame:
    """Every encoder table as kernel rows with ``operators`` columns plus table, run, rank, part."""
    frames = []
    for path in sorted(DATA.glob(f"runs/{CLUSTER}/*/*/[0-9]/encoder_*.csv")):
        raw = read_kernel_table(path)
        run, rank, part = path.parents[2].name, int(path.parent.name), path.stem.removeprefix("encoder_")
        frames.append(
            raw.select(
                pl.lit(run).alias("run"),
                pl.lit(rank).alias("rank"),
                pl.lit(part).alias("part"),
                pl.lit(f"{run}/{rank}/{part}").alias("run_id"),
                pl.col("inner_op").alias("cpu_op_name"),
                pl.col("inner_id").alias("cpu_op_event_id"),
                pl.col("inner_dims").alias("input_dims"),
                pl.col("kernel").alias("name"),
                activity_kind(pl.col("kernel")).alias("kind"),
                (pl.col("dur_us") * 1000).round().cast(pl.Int64).alias("dur_ns"),
            )
        )
    rows = pl.concat(frames).with_columns(
        pl.col("input_dims").map_elements(lambda d: types_for(d, HALF), return_dtype=pl.Utf8).alias("input_types"),
        pl.lit(None, pl.Utf8).alias("cpu_concrete_inputs"),
    )
    keys = ["cpu_op_name", "name", "kind", "input_dims", "input_types", "cpu_concrete_inputs"]
    shapes = family_shape_table(rows)
    rows = rows.join(shapes, on=keys, how="left", nulls_equal=True, maintain_order="left")
    flags = misaligned_ops(rows.with_columns(pl.col("name").alias("kernel_name")))
    return rows.with_columns(flags, pl.col("part").alias("phase"))


def family_table(ops: pl.DataFrame) -> pl.DataFrame:
    """Per family over ``ops`` (one row per operator with dur_ns, kernels, pred)."""
    total = float(ops.get_column("dur_ns").sum())
    out = []
    for family in FAMILIES:
        part = ops.filter(pl.col("family") == family)
        measured = part.get_column("dur_ns").to_numpy().astype(np.float64)
        pred = part.get_column("pred").to_numpy()
        covered = np.isfinite(pred)
        ape = np.abs(pred[covered] - measured[covered]) / measured[covered] * 100
        cov_ns = float(measured[covered].sum())
        out.append(
            {
                "family": family,
                "kernels": int(part.get_column("kernels").sum()),
                "ops": part.height,
                "share_%": round(100 * float(measured.sum()) / total, 1),
                "coverage_%": round(100 * cov_ns / float(measured.sum()), 1) if part.height else None,
                "covered_ops": int(covered.sum()),
                "MAPE_%": round(float(ape.mean()), 1) if ape.size else None,
                "p50_%": round(float(np.median(ape)), 1) if ape.size else None,
                "time_err_%": round(100 * (float(pred[covered].sum()) - cov_ns) / cov_ns, 1) if cov_ns else None,
            }
        )
    return pl.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="a database already calibrated for perlmutter")
    parser.add_argument(
        "--unsampled",
        choices=["uncovered", "baseline"],
        help="element-wise ops without a sweep of their own: keep them uncovered, or predict them with "
        "the family's bandwidth baseline (default: the library's)",
    )
    parser.add_argument("--worst", type=int, default=3, help="worst operators to print per family")
    args = parser.parse_args()
    db = args.db or calibrated_db()
    models = Session(db).models(CLUSTER)
    if args.unsampled:
        models.unsampled = args.unsampled
    rows = read_tables()
    flagged = rows.group_by("run_id", maintain_order=True).agg(
        pl.len().alias("kernels"), pl.col("misaligned").sum().alias("misaligned")
    )
    ops = per_operator(rows.filter(~pl.col("misaligned")))
    ops = ops.with_columns(pl.Series("pred", models.predict(ops)))
    clean = flagged.filter(pl.col("misaligned") == 0).get_column("run_id").to_list()
    pl.Config.set_tbl_rows(100)
    pl.Config.set_tbl_cols(-1)
    pl.Config.set_tbl_width_chars(200)
    pl.Config.set_fmt_str_lengths(80)
    pl.Config.set_tbl_formatting("ASCII_MARKDOWN")
    pl.Config.set_tbl_hide_dataframe_shape(True)
    pl.Config.set_tbl_hide_column_data_types(True)
    print(f"misaligned rows per table (misaligned_ops): {int(flagged['misaligned'].sum())} of {rows.height}")
    print(flagged.filter(pl.col("misaligned") > 0))
    print(f"\nper family, the {len(clean)} tables with no misaligned row")
    print(family_table(ops.filter(pl.col("run_id").is_in(clean))))
    print(f"\nper family, all {flagged.height} tables, misaligned rows dropped")
    print(family_table(ops))
    worst = (
        ops.filter(pl.col("pred").is_not_nan() & pl.col("family").is_in(FAMILIES[:5]))
        .with_columns(err=(pl.col("pred") / pl.col("dur_ns") - 1) * 100)
        .group_by("family", "cpu_op_name", "input_dims")
        .agg(
            pl.len().alias("n"),
            (pl.col("dur_ns").mean() / 1e3).round(1).alias("meas_us"),
            (pl.col("pred").mean() / 1e3).round(1).alias("pred_us"),
            pl.col("err").mean().round(1).alias("err_%"),
        )
        .sort(pl.col("err_%").abs(), descending=True)
        .group_by("family", maintain_order=True)
        .head(args.worst)
        .with_columns(pl.col("input_dims").str.slice(0, 60))
    )
    print("\nworst covered operators (all tables)")
    print(worst)


if __name__ == "__main__":
    main()

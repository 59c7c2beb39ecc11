"""Sampling and in-trace errors on the shared H200 traces (issue 26 items 1, 4 and 6), on any machine.

For ``gpt_h2048_l8_bf16`` and ``demo_tiny`` in ``../shared/data/gpu/h200/`` this prints, in one run:

1. **Coverage**: the share of the best iteration's GPU operator time the ``--from-run`` points cover
   (``samplers.from_run.run_points``), the traced and neighbourhood point counts, and what is left
   uncovered, by name.
2. **In-trace errors per family**: the shared H200 samples imported and calibrated
   (``calibrate --cluster h200``), then every traced operator of both runs predicted
   (``calibrate``'s in-trace validation): coverage, MAPE, p50 and the time-weighted error (predicted − measured
   over the covered operators' measured time) per run and family.
   The element-wise calls of gpt by op, dtype and bytes per element come next: a cast between
   float32 and bfloat16 moves 6 bytes per element, a same-dtype copy 4 or 8.
3. **Why**: the shared samples' CUDA-event medians against the trace's own durations for the very
   same calls (op, direction, shape, dtype, bytes), time-weighted per family; and the timing probe
   (``timing_probe.json``): one event-timed call, a burst of 50 and the profiler's kernel duration of
   the traced GEMM shapes, against the trace's kernels of those shapes.

Usage::

    python benchmarks/gpu_trace_sampling.py [--db DB]

Without ``--db`` a temporary database is made (ingest, import, calibrate: about two minutes on two
cores); with ``--db`` it must already hold both runs (cluster h200) and the calibrated models.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from tracecal.api import Session
from tracecal.calibrate import load
from tracecal.calibrate.in_trace import in_trace_report, traced_rows
from tracecal.config import model_store_dir
from tracecal.samplers.from_run import run_points
from tracecal.samplers.plan import neighbourhood
from tracecal.sql.connection import open_database
from tracecal.sql.samples import read_samples

REPO = Path(__file__).resolve().parents[1]
H200 = REPO.parent / "shared" / "data" / "gpu" / "h200"
RUNS = ("gpt_h2048_l8_bf16", "demo_tiny")
CLUSTER = "h200"

SAME_CALL = {
    # traced innermost CPU op -> (sampled op, direction) of the shared samples' sampler
    "aten::mm": ("aten::mm", "fwd"),
    "aten::addmm": ("aten::addmm", "fwd"),
    "aten::native_layer_norm": ("aten::layer_norm", "fwd"),
    "aten::native_layer_norm_backward": ("aten::layer_norm", "bwd"),
    "aten::gelu": ("aten::gelu", "fwd"),
    "aten::gelu_backward": ("aten::gelu", "bwd"),
    "aten::add": ("aten::add", "fwd"),
    "aten::add_": ("aten::add", "fwd"),
    "aten::copy_": ("aten::copy_", "fwd"),
    "aten::fill_": ("aten::fill_", "fwd"),
}
KEY = ["m", "n", "k", "elements", "dtype", "io_bytes"]


def prepare(db: Path) -> None:
    """Ingest both runs, import the shared samples, calibrate."""
    from tracecal.pipeline.ingest import IngestOptions, ingest_runs

    with open_database(db) as con:
        ingest_runs(con, [H200 / run for run in RUNS], IngestOptions(cluster=CLUSTER, workers=1))
    import subprocess
    import sys

    tracecal = Path(sys.executable).parent / "tracecal"
    samples = H200 / "samples" / "h200_samples.parquet"
    subprocess.run(
        [str(tracecal), "samples", "import", str(samples), "--cluster", CLUSTER, "--format", "parquet",
         "--db", str(db)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    Session(db).calibrate(CLUSTER)


def coverage(con: object) -> None:
    print("## coverage of the best iteration's GPU operator time by the --from-run points")
    for run in RUNS:
        plan = run_points(con, run)  # type: ignore[arg-type]
        share = math.floor(1000 * (plan.coverage or 0)) / 10
        print(
            f"{run}: coverage: {share:.1f} % of GPU operator time ({plan.covered_ns / 1e6:.2f} of "
            f"{plan.total_ns / 1e6:.2f} ms); {len(plan.points)} traced points, "
            f"{len(neighbourhood(plan.points))} with the neighbourhood"
        )
        for (name, reason), ns in sorted(plan.uncovered.items(), key=lambda kv: -kv[1]):
            print(f"    not covered: {name:<14} {100 * ns / plan.total_ns:6.3f} %  {reason}")


def in_trace(con: object, db: Path) -> None:
    print("\n## in-trace errors per family (shared H200 samples, calibrated here)")
    rows = traced_rows(con, CLUSTER)  # type: ignore[arg-type]
    report = in_trace_report(rows, load(CLUSTER, con, store_dir=model_store_dir(db)).predict(rows))  # type: ignore[arg-type]
    print(f"{'run':<18} {'family':<12} {'ops':>6} {'meas ms':>9} {'covered':>8} {'MAPE':>7} {'p50':>7} {'time err':>9}")
    for r in report.iter_rows(named=True):
        fmt = lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"  # noqa: E731
        print(
            f"{r['run_id']:<18} {r['family']:<12} {r['operators']:>6} {r['measured_ms']:>9.2f} "
            f"{fmt(100 * r['covered_share'] if r['covered_share'] is not None else None):>7}% "
            f"{fmt(r['mape']):>7} {fmt(r['p50_ape']):>7} {fmt(r['time_error']):>8}%"
        )


def elementwise_calls(con: object, db: Path) -> None:
    """In-trace errors of the element-wise calls, by op, dtype and bytes per element: a cast (a
    ``copy_`` between float32 and bfloat16, 6 bytes per element) apart from same-dtype copies."""
    print("\n## in-trace errors of element-wise calls by op, dtype and bytes per element (gpt)")
    rows = traced_rows(con, CLUSTER)  # type: ignore[arg-type]
    rows = rows.filter((pl.col("run_id") == RUNS[0]) & (pl.col("family") == "elementwise"))
    predicted = load(CLUSTER, con, store_dir=model_store_dir(db)).predict(rows)  # type: ignore[arg-type]
    rows = rows.with_columns(
        pl.Series("pred", np.asarray(predicted, dtype=float)),
        (pl.col("io_bytes") / pl.col("elements")).round(1).alias("bytes_per_element"),
    ).filter(pl.col("pred").is_not_nan())
    table = (
        rows.group_by("cpu_op_name", "dtype", "bytes_per_element")
        .agg(
            pl.len().alias("ops"),
            pl.col("dur_ns").sum().alias("measured"),
            pl.col("pred").sum().alias("predicted"),
            ((pl.col("pred") - pl.col("dur_ns")).abs() / pl.col("dur_ns")).mean().alias("mape"),
        )
        .sort("measured", descending=True)
        .head(10)
    )
    print(f"{'op':<22} {'dtype':<9} {'B/elem':>6} {'ops':>5} {'meas ms':>8} {'pred ms':>8} {'MAPE':>6} {'time err':>9}")
    for r in table.iter_rows(named=True):
        print(
            f"{r['cpu_op_name'] or '':<22} {r['dtype'] or '':<9} {r['bytes_per_element'] or float('nan'):>6.1f} "
            f"{r['ops']:>5} {r['measured'] / 1e6:>8.2f} {r['predicted'] / 1e6:>8.2f} {100 * r['mape']:>6.1f} "
            f"{100 * (r['predicted'] / r['measured'] - 1):>+8.1f}%"
        )


def same_calls(con: object) -> None:
    """The shared samples against the trace for the very same calls (time-weighted)."""
    print("\n## shared samples (CUDA events, one call) vs the trace's durations of the same calls (gpt)")
    rows = traced_rows(con, CLUSTER)  # type: ignore[arg-type]
    rows = rows.filter((pl.col("run_id") == RUNS[0]) & pl.col("cpu_op_name").is_in(list(SAME_CALL)))
    rows = rows.with_columns(
        pl.col("cpu_op_name").replace_strict({k: v[0] for k, v in SAME_CALL.items()}).alias("op"),
        pl.col("cpu_op_name").replace_strict({k: v[1] for k, v in SAME_CALL.items()}).alias("direction"),
    )
    samples = read_samples(con, CLUSTER).filter(pl.col("source_file") != "")  # type: ignore[arg-type]
    key = ["op", "direction", *KEY]
    # a bwd sample carries its forward call's bytes, a traced backward op its own: match on elements
    rows = rows.with_columns(
        pl.when(pl.col("direction") == "bwd").then(None).otherwise(pl.col("io_bytes")).alias("io_bytes")
    )
    samples = samples.with_columns(
        pl.when(pl.col("direction") == "bwd").then(None).otherwise(pl.col("io_bytes")).alias("io_bytes")
    )
    traced = rows.group_by(key).agg(pl.len().alias("calls"), pl.col("dur_ns").median().alias("traced_ns"))
    sampled = samples.group_by(key).agg(pl.col("median_ns").median().alias("sample_ns"))
    both = traced.join(sampled, on=key, how="inner", nulls_equal=True)
    print(f"{'op':<18} {'dir':<4} {'shapes':>6} {'calls':>6} {'trace ms':>9} {'sample ms':>10} {'sample/trace':>13}")
    for (op, direction), part in both.group_by(["op", "direction"], maintain_order=True):
        trace_ms = float((part["traced_ns"] * part["calls"]).sum()) / 1e6
        sample_ms = float((part["sample_ns"] * part["calls"]).sum()) / 1e6
        print(
            f"{op:<18} {direction:<4} {part.height:>6} {int(part['calls'].sum()):>6} {trace_ms:>9.2f} "
            f"{sample_ms:>10.2f} {100 * (sample_ms / trace_ms - 1):>+12.1f}%"
        )
    unmatched = traced.join(sampled, on=key, how="anti", nulls_equal=True)
    by_op = unmatched.group_by("op").agg(pl.col("calls").sum(), (pl.col("traced_ns") * pl.col("calls")).sum())
    for op, calls, ns in by_op.sort("traced_ns", descending=True).iter_rows():
        print(f"    no sample of the same call: {op:<16} {calls:>5} calls, {ns / 1e6:8.2f} ms")


def probe(con: object) -> None:
    print("\n## timing probe (H200, bf16 GEMMs of the traced shapes, µs, medians of 20) vs the trace")
    data = json.loads((H200 / "timing_probe.json").read_text())
    traced = con.execute(  # type: ignore[attr-defined]
        "SELECT m, n, k, median(dur_ns) / 1e3 FROM operators WHERE run_id = ? AND family = 'gemm' "
        "AND kind = 'kernel' AND cpu_op_name = 'aten::mm' GROUP BY ALL",
        [RUNS[0]],
    ).fetchall()
    trace = {(m, n, k): us for m, n, k, us in traced}
    print(f"{'m x n x k':<20} {'layout':<6} {'events':>8} {'ev+flush':>9} {'burst':>8} {'kernel':>8} {'trace':>8} "
          f"{'ev/kern':>8} {'trace/kern':>10}")  # fmt: skip
    ratios: dict[str, list[float]] = {"ev": [], "evf": [], "burst": [], "trace": []}
    for r in data:
        shape = (r["m"], r["n"], r["k"])
        kernel = r["prof_flush"]
        t = trace.get(shape)
        ratios["ev"].append(r["ev_warm"] / kernel)
        ratios["evf"].append(r["ev_flush"] / kernel)
        ratios["burst"].append(r["burst"] / kernel)
        if t is not None:
            ratios["trace"].append(t / kernel)
        print(
            f"{'x'.join(map(str, shape)):<20} {r['layout']:<6} {r['ev_warm']:>8.1f} {r['ev_flush']:>9.1f} "
            f"{r['burst']:>8.1f} {kernel:>8.1f} {'' if t is None else f'{t:8.1f}':>8} "
            f"{r['ev_warm'] / kernel:>8.2f} {'' if t is None else f'{t / kernel:10.2f}':>10}"
        )
    print(
        "median over shapes: events/kernel "
        f"{np.median(ratios['ev']):.2f} (after an L2 flush {np.median(ratios['evf']):.2f}), "
        f"burst/kernel {np.median(ratios['burst']):.3f}, trace/kernel "
        f"{np.median(ratios['trace']) if ratios['trace'] else float('nan'):.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="a database with both runs ingested and h200 calibrated")
    args = parser.parse_args()
    db = args.db
    if db is None:
        db = Path(tempfile.mkdtemp(prefix="tracecal-h200-")) / "h200.duckdb"
        prepare(db)
    with open_database(db) as con:
        coverage(con)
        in_trace(con, db)
        elementwise_calls(con, db)
        same_calls(con)
        probe(con)


if __name__ == "__main__":
    main()

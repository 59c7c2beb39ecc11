"""In-trace validation: predict the operators measured in a cluster's ingested runs and compare.

The published system validated its regressors only on held-out microbenchmark samples; a model can
score 3 % there and still miss what the op costs inside training (other streams, caches, fused
kernels, shapes outside the grid). Here every traced compute operator and collective of the runs whose
``runs.cluster`` is the calibrated cluster is routed to a model, and per run and family we report the
same error metrics as on samples plus the share of traced time a model covered.

The unit scored is the CPU operator, not the kernel: a sample times one call of an op, whatever
kernels it launched (a layer norm backward runs two), so the kernels of one CPU operator are summed
(``per_operator``) and the operator is predicted once.

``traced_rows`` reads (I/O); ``per_operator`` and ``in_trace_report`` are pure transforms.
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from tracecal.calibrate.validation import error_metrics
from tracecal.decode.parameters import StepParameters, parameter_groups
from tracecal.schema import SHAPE_COLUMNS
from tracecal.sql.query_files import query_file, query_frame
from tracecal.vocabulary import GPU_ACTIVITY_KINDS

REPORT_SCHEMA = {
    "run_id": pl.Utf8,
    "family": pl.Utf8,
    "kernels": pl.Int64,
    "operators": pl.Int64,
    "predicted": pl.Int64,
    "measured_ms": pl.Float64,
    "predicted_ms": pl.Float64,
    "covered_share": pl.Float64,
    "mape": pl.Float64,
    "p50_ape": pl.Float64,
    "p90_ape": pl.Float64,
    "max_ape": pl.Float64,
    "time_error": pl.Float64,
}
"""Columns of the in-trace table: ``kernels`` and CPU ``operators`` of the family, ``measured_ms`` of
all of them, ``predicted_ms`` of the covered ones (and their measured sum is ``covered_share`` ×
``measured_ms``), errors in %; ``time_error`` is the signed error of the covered time,
``100 · (predicted − measured) / measured`` summed over the covered operators."""


def traced_rows(con: duckdb.DuckDBPyConnection, cluster: str) -> pl.DataFrame:
    """Compute operators (``operators``) and collectives of every run of ``cluster``, one frame.

    One row per CPU operator (``per_operator``: its kernels' durations summed, ``kernels`` counts
    them) or collective. Columns: run_id, rank, event_id, cpu_op_event_id, name, family, phase,
    dur_ns, kernels, the shape columns, and for collectives ``collective`` and the comm columns (NULL
    on compute rows). Empty when the cluster has no ingested runs.
    """
    ops = query_frame(con, "calibrate_traced_operators", [cluster])
    comms = query_frame(con, "calibrate_traced_collectives", [cluster])
    parameters = {
        run_id: parameter_groups(query_file(con, "run_parameters", [run_id]).to_pylist())
        for run_id in ops.filter(pl.col("optimizer_step").is_not_null()).get_column("run_id").unique().to_list()
    }
    ops = optimizer_steps(ops, parameters).drop("optimizer_step_id", "optimizer_step")
    return pl.concat([per_operator(ops), comms], how="diagonal_relaxed")


STEP_COLUMNS = ("optimizer_step_id", "optimizer_step", "step_params", "step_tensors", "step_dtype")
"""Columns that place an operator in an optimizer step: the ``Optimizer.step#<Class>.step``
annotation around its CPU operator (event id and name; NULL outside a step) and the parameters the
rank's step updates (``decode.parameters``)."""


STEP_KINDS = GPU_ACTIVITY_KINDS
"""Activity kinds a step is modelled whole on: GPU work, which a step sample times as the trace does
(its kernels, ``samplers.timing``). On a CPU-only trace the step's operators are the leaf ops, and
the Python time between them is a gap the replay keeps, while a CPU step sample (``perf_counter``, or
the profiler's step range) holds that time too: there the step's operators stay operators of their
own."""


def step_parameter_frame(parameters: dict[str, dict[int, StepParameters]], rank_type: pl.DataType) -> pl.DataFrame:
    """``parameters`` (run_id -> rank -> the step's parameters) as rows: run_id, rank, step_params,
    step_tensors, step_dtype."""
    return pl.DataFrame(
        [
            {"run_id": run_id, "rank": rank, "step_params": p.params, "step_tensors": p.tensors, "step_dtype": p.dtype}
            for run_id, ranks in parameters.items()
            for rank, p in ranks.items()
        ],
        schema={"run_id": pl.Utf8, "rank": rank_type, "step_params": pl.Int64, "step_tensors": pl.Int64,
                "step_dtype": pl.Utf8},
    )  # fmt: skip


def optimizer_steps(rows: pl.DataFrame, parameters: dict[str, dict[int, StepParameters]]) -> pl.DataFrame:
    """``as_optimizer_steps`` of ``rows`` (with ``optimizer_step_id``/``optimizer_step``) given each
    run's and rank's step parameters."""
    if "optimizer_step" not in rows.columns or rows.get_column("optimizer_step").is_null().all():
        return rows
    shapes = step_parameter_frame(parameters, rows.schema["rank"])
    joined = rows.join(shapes, on=["run_id", "rank"], how="left", maintain_order="left")
    return as_optimizer_steps(joined).drop("step_params", "step_tensors", "step_dtype")


def as_optimizer_steps(rows: pl.DataFrame) -> pl.DataFrame:
    """The operators inside an ``Optimizer.step#<Class>.step`` annotation as one operator, the step,
    as the sampler times it (``samplers.cases``: a whole step over the parameters): every kernel
    of the step is keyed by the annotation (``cpu_op_event_id``), named by it, of family
    ``optimizer``, with the rank's parameters (``STEP_COLUMNS``) as its shape: ``params``,
    ``batch`` = tensors, ``elements``, ``dtype``. Only GPU activities are grouped (``STEP_KINDS``;
    all rows of a frame without ``kind``). Rows outside a step are returned as they are; so is a
    frame without the step columns. The in-trace check and the predicted replay both use it."""
    if any(c not in rows.columns for c in STEP_COLUMNS) or rows.get_column("optimizer_step").is_null().all():
        return rows
    step = pl.col("optimizer_step").is_not_null()
    if "kind" in rows.columns:
        step = step & pl.col("kind").is_in(STEP_KINDS).fill_null(False)
    own = ("params", "elements", "batch", "dtype")  # the step's shape; every other shape column is cleared
    shape_columns = [c.name for c in SHAPE_COLUMNS if c.name not in own and c.name in rows.columns]
    kept = {c: pl.col(c) if c in rows.columns else pl.lit(None) for c in own}
    return rows.with_columns(
        pl.when(step).then(pl.col("optimizer_step_id")).otherwise(pl.col("cpu_op_event_id")).alias("cpu_op_event_id"),
        pl.when(step).then(pl.col("optimizer_step")).otherwise(pl.col("cpu_op_name")).alias("cpu_op_name"),
        pl.when(step).then(pl.lit("optimizer")).otherwise(pl.col("family")).alias("family"),
        pl.when(step).then(pl.col("step_params")).otherwise(kept["params"]).alias("params"),
        pl.when(step).then(pl.col("step_params")).otherwise(kept["elements"]).alias("elements"),
        pl.when(step).then(pl.col("step_tensors")).otherwise(kept["batch"]).alias("batch"),
        pl.when(step).then(pl.col("step_dtype")).otherwise(kept["dtype"]).alias("dtype"),
        *(pl.when(step).then(None).otherwise(pl.col(c)).alias(c) for c in shape_columns),
    )


def per_operator(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per CPU operator: the kernels sharing (run_id, rank, cpu_op_event_id) become one row
    with the longest kernel's columns (its main work: a cuBLAS workspace memset does not make an mm
    a memset), ``dur_ns`` their sum and ``kernels`` their count.

    Rows without ``cpu_op_event_id`` (an unlinked kernel; a frame without the column) stay one
    operator each. ``run_id`` and ``rank`` join the key where the frame has them. A frame that
    already has ``kernels`` is taken to be per operator and returned as it is.
    """
    if "kernels" in rows.columns:
        return rows
    if rows.height == 0 or "cpu_op_event_id" not in rows.columns:
        return rows.with_columns(pl.lit(1, pl.Int64).alias("kernels"))
    # an unlinked kernel is its own operator: a key no linked row can take
    unlinked = -1 - pl.int_range(pl.len(), dtype=pl.Int64)
    key = pl.coalesce(pl.col("cpu_op_event_id").cast(pl.Int64), unlinked).alias("_op")
    by = [c for c in ("run_id", "rank") if c in rows.columns] + ["_op"]
    others = [c for c in rows.columns if c not in (*by, "dur_ns")]
    return (
        rows.with_columns(key)
        .group_by(by, maintain_order=True)
        .agg(
            *(pl.col(c).sort_by("dur_ns", descending=True, maintain_order=True).first() for c in others),
            pl.col("dur_ns").sum(),
            pl.len().cast(pl.Int64).alias("kernels"),
        )
        .select(*rows.columns, "kernels")
    )


def in_trace_report(rows: pl.DataFrame, predicted_ns: np.ndarray) -> pl.DataFrame:
    """Per run and family (plus a family ``all`` row per run): operators, how many a model predicted,
    measured and predicted time, covered share of the measured time, and MAPE / p50 / p90 / max APE
    over the predicted operators.

    Args:
        rows: ``traced_rows`` output, one row per operator (needs run_id, family, dur_ns; ``kernels``
            per operator, 1 when absent).
        predicted_ns: ``CalibratedModels.predict(rows)``; NaN where no model covers the row.
    """
    if rows.height == 0:
        return pl.DataFrame(schema=REPORT_SCHEMA)
    kernels = pl.col("kernels") if "kernels" in rows.columns else pl.lit(1, pl.Int64).alias("kernels")
    frame = rows.select("run_id", pl.col("family").fill_null("other"), "dur_ns", kernels).with_columns(
        pl.Series("pred", np.asarray(predicted_ns, dtype=np.float64))
    )
    out = []
    for run_id in sorted(frame.get_column("run_id").unique().to_list()):
        run = frame.filter(pl.col("run_id") == run_id)
        families = sorted(run.get_column("family").unique().to_list())
        for family in [*families, "all"]:
            part = run if family == "all" else run.filter(pl.col("family") == family)
            measured = part.get_column("dur_ns").to_numpy().astype(np.float64)
            pred = part.get_column("pred").to_numpy()
            covered = np.isfinite(pred)
            metrics = error_metrics(pred[covered], measured[covered])
            total = float(measured.sum())
            covered_ns = float(measured[covered].sum())
            out.append(
                {
                    "run_id": run_id,
                    "family": family,
                    "kernels": int(part.get_column("kernels").sum()),
                    "operators": int(part.height),
                    "predicted": int(covered.sum()),
                    "measured_ms": total / 1e6,
                    "predicted_ms": float(pred[covered].sum()) / 1e6,
                    "covered_share": float(measured[covered].sum()) / total if total else None,
                    "mape": metrics["mape"],
                    "p50_ape": metrics["p50_ape"],
                    "p90_ape": metrics["p90_ape"],
                    "max_ape": metrics["max_ape"],
                    "time_error": 100 * (float(pred[covered].sum()) - covered_ns) / covered_ns if covered_ns else None,
                }
            )
    return pl.DataFrame(out, schema=REPORT_SCHEMA)

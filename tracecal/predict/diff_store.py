"""`tracecal diff`: read two stored runs (or one run and its replay) and compare them (``predict.diff``)."""

from __future__ import annotations

import duckdb
import polars as pl

from tracecal.errors import PredictionError, RunNotFoundError
from tracecal.predict import diff as dm
from tracecal.predict.durations import DurationModel
from tracecal.predict.store import load_iteration, predict_stored_run
from tracecal.sql.query_files import query_frame


def diff_runs(con: duckdb.DuckDBPyConnection, run_a: str, run_b: str, by: str = "family") -> dm.Diff:
    """Compare the best iterations of two stored runs (B − A).

    Raises:
        RunNotFoundError: a run is missing. PredictionError: unknown ``by``, a run without iterations.
    """
    if by not in dm.BY:
        raise PredictionError(f"unknown --by {by!r}; use one of {', '.join(dm.BY)}")
    return dm.diff(_side(con, run_a, by), _side(con, run_b, by), by)


def diff_predicted(con: duckdb.DuckDBPyConnection, run: str, model: DurationModel, by: str = "family") -> dm.Diff:
    """Compare the best iteration of ``run`` as measured (A) with its replay with ``model``'s durations (B).

    Raises:
        RunNotFoundError, PredictionError: see ``predict_stored_run``; unknown ``by``.
    """
    if by not in dm.BY:
        raise PredictionError(f"unknown --by {by!r}; use one of {', '.join(dm.BY)}")
    _, pred = predict_stored_run(con, run, mode="predicted", model=model)
    if by == "component":
        return dm.diff(
            dm.component_side(f"{run} measured", pred.components, "measured_ns"),
            dm.component_side(f"{run} predicted", pred.components, "predicted_ns"),
            by,
        )
    names = pred.graph.nodes.filter(pl.col("node_kind") == "activity").select(
        pl.col("rank").cast(pl.Int32), "event_id", "name"
    )
    rows = pred.predictions.join(names.unique(["rank", "event_id"]), on=["rank", "event_id"], how="left")
    a, b = dm.predicted_sides(rows, pred.iteration_error(), by, run)
    return dm.diff(a, b, by)


def _side(con: duckdb.DuckDBPyConnection, run: str, by: str) -> dm.Side:
    if by == "component":
        _, pred = predict_stored_run(con, run, mode="measured")
        return dm.component_side(run, pred.components)
    stored = load_iteration(con, run)  # the run exists and has a best iteration, or says why not
    ops = query_frame(con, "diff_operator_time", [run])
    if ops.height == 0:
        raise RunNotFoundError(f"run {run} has no operators in its best iteration; re-ingest it with trace-ingest")
    its = stored.measured_iteration_ns.select("rank", pl.col("measured_iteration_ns").alias("iteration_ns"))
    return dm.operator_side(run, ops, its, by)

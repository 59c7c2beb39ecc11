"""Validation of a stored decoded GPT-NeoX run against the published measurements (reads the database).

A decoded run (``runs.format = 'gpumodeling25'``) carries the published best-iteration module times
and comparison in ``runs.metadata_json``. Its rebuilt iteration is replayed (``predict_stored_run``),
every DeepSpeed module's span is read off the replayed timeline (``module_times``) at the traced ranks
(head, first middle stage, tail), and ``published.component_errors`` scores them with the published
rules. See ``docs/published-runs.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import duckdb
import polars as pl

from tracecal.errors import PredictionError
from tracecal.predict.components import error_pct_expr
from tracecal.predict.durations import DurationModel
from tracecal.predict.run import Prediction
from tracecal.predict.store import StoredIteration, predict_stored_run
from tracecal.sources.gpumodeling25.read.folder import DECODED_FORMAT
from tracecal.sources.gpumodeling25.validate.module_times import module_members, module_times, per_position
from tracecal.sources.gpumodeling25.validate.published import component_errors, stage_comparison
from tracecal.sql.query import run_metadata


@dataclass(frozen=True)
class PublishedValidation:
    """One decoded run's validation: the Table 9 rows, per-stage module times and the replay."""

    run_id: str
    components: pl.DataFrame
    stages: pl.DataFrame
    modules: pl.DataFrame
    prediction: Prediction
    stored: StoredIteration


def is_decoded_run(con: duckdb.DuckDBPyConnection, run_id: str) -> bool:
    row = con.execute("SELECT format FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return row is not None and row[0] == DECODED_FORMAT


def traced_ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> list[int]:
    """Global ranks of the head, the first middle stage and the tail (the rank folders 0, 1, 2)."""
    ranks = [r[0] for r in con.execute("SELECT rank FROM ranks WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()]
    if len(ranks) < 2:
        raise PredictionError(f"run {run_id} has {len(ranks)} rebuilt stage(s); re-ingest it with trace-ingest")
    return [ranks[0], ranks[1] if len(ranks) > 2 else ranks[-1], ranks[-1]]


def _metadata(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """The run's stored metadata, which must carry the published module times."""
    meta = run_metadata(con, run_id)
    if "best_batch_module_times" not in meta:
        raise PredictionError(f"run {run_id} carries no published module times; re-ingest its decoded run folder")
    return meta


def validate_decoded_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    *,
    mode: str = "predicted",
    model: DurationModel | None = None,
    scale: Mapping[str, float] | None = None,
) -> PublishedValidation:
    """Replay a decoded run and compare its module times with the published measurements.

    Raises:
        RunNotFoundError, PredictionError: the run is missing, not decoded, or cannot be replayed.
    """
    meta = _metadata(con, run_id)
    stored, pred = predict_stored_run(con, run_id, mode=mode, model=model, scale=scale)
    times = module_times(module_members(con, run_id, stored.iteration), pred)
    ranks = traced_ranks(con, run_id)
    predicted = per_position(times, ranks, "predicted_us")
    measured = meta["best_batch_module_times"]
    avg, old, low = measured.get("average", {}), measured.get("average_old"), measured.get("min")
    components = component_errors(run_id, avg, old, low, predicted, meta.get("published_compares") or None)
    stages = stage_comparison(run_id, avg, old, low, predicted)
    return PublishedValidation(run_id, components, stages, times, pred, stored)


def with_published_iteration(con: duckdb.DuckDBPyConnection, run_id: str, prediction: Prediction) -> Prediction:
    """The prediction with each rank's measured iteration set to the published best iteration's
    ``train_batch`` time of its position (head, middle stages, tail): what the rebuilt schedule is
    checked against, rather than the rebuilt timeline itself."""
    meta = _metadata(con, run_id)
    train_batch = meta["best_batch_module_times"].get("average", {}).get("update")
    if not train_batch:
        return prediction
    ranks = sorted(prediction.components["rank"].unique().to_list())
    position = {r: 0 if r == ranks[0] else 2 if r == ranks[-1] else 1 for r in ranks}
    measured = {r: round(train_batch[p] * 1e3) for r, p in position.items() if train_batch[p]}
    it = (pl.col("component") == "iteration") & pl.col("rank").is_in(list(measured))
    new = pl.col("rank").replace_strict(measured, default=None, return_dtype=pl.Int64)
    components = prediction.components.with_columns(
        pl.when(it).then(new).otherwise(pl.col("measured_ns")).alias("measured_ns")
    ).with_columns(error_pct_expr())
    return replace(prediction, components=components)

"""Reading a stored iteration for the replay, and writing ``predictions`` / ``components`` back.

The only module of ``tracecal.predict`` that talks to the database; everything else is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import duckdb
import polars as pl

from tracecal.calibrate.in_trace import step_parameter_frame
from tracecal.decode.parameters import parameter_groups
from tracecal.decode.topology import group_topology
from tracecal.errors import PredictionError, RunNotFoundError
from tracecal.predict.durations import DurationModel
from tracecal.predict.graph import ReplayInputs
from tracecal.predict.run import Prediction, predict_iteration, result_tables
from tracecal.schema import COMPONENTS, PREDICTIONS
from tracecal.sql.query_files import query_file, query_frame


@dataclass(frozen=True)
class StoredIteration:
    """One iteration of a stored run, ready for ``build_graph``.

    Attributes:
        run_id, iteration: what was loaded.
        inputs: the graph inputs.
        measured_iteration_ns: per rank (rank, measured_iteration_ns) as decoded.
        paired_p2p: send/recv rows the decoder left unmatched that were paired here by order.
    """

    run_id: str
    iteration: int
    inputs: ReplayInputs
    measured_iteration_ns: pl.DataFrame
    paired_p2p: int


def load_iteration(con: duckdb.DuckDBPyConnection, run_id: str, iteration: int | None = None) -> StoredIteration:
    """Load the best iteration (or ``iteration``) of ``run_id`` for the replay.

    Raises:
        RunNotFoundError: the run is not in the database.
        PredictionError: the run has no decoded iterations / operators, or ``iteration`` does not exist.
    """
    if not con.execute("SELECT run_id FROM runs WHERE run_id = ?", [run_id]).fetchall():
        known = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        raise RunNotFoundError(
            f"no run {run_id!r} in the database (runs: {', '.join(known) or 'none'}); ingest it with trace-ingest"
        )
    if iteration is None:
        best = query_frame(con, "predict_best_iteration", [run_id])
        if best.height == 0:
            raise PredictionError(f"run {run_id} has no decoded iterations; re-ingest it with trace-ingest")
        iteration = int(best["iteration"][0])
    ranks = query_frame(con, "predict_ranks", [run_id, iteration])
    if ranks.height == 0:
        raise PredictionError(f"run {run_id} has no iteration {iteration}; see `tracecal iterations {run_id}`")
    acts = query_frame(con, "predict_activities", [run_id, iteration])
    if acts.height == 0:
        raise PredictionError(f"run {run_id} iteration {iteration} has no operators; was the run decoded?")
    acts = _with_optimizer_steps(con, run_id, iteration, acts)
    colls = query_frame(con, "predict_collectives", [run_id, iteration])
    colls, paired = pair_unmatched_p2p(colls)
    runtime = query_frame(con, "predict_runtime", [iteration, run_id])
    carry_in = query_frame(con, "predict_stream_carry_in", [run_id, iteration])
    return StoredIteration(
        run_id=run_id,
        iteration=iteration,
        inputs=ReplayInputs(activities=acts, collectives=colls, runtime=runtime, ranks=ranks, carry_in=carry_in),
        measured_iteration_ns=ranks.select("rank", "measured_iteration_ns"),
        paired_p2p=paired,
    )


def _with_optimizer_steps(
    con: duckdb.DuckDBPyConnection, run_id: str, iteration: int, acts: pl.DataFrame
) -> pl.DataFrame:
    """``acts`` with ``in_trace.STEP_COLUMNS`` where an optimizer step ran (the annotation around the
    operator, the parameters the rank's step updates), so the predicted replay models a step whole;
    ``acts`` unchanged when the iteration has none."""
    steps = query_frame(con, "predict_optimizer_steps", [run_id, iteration])
    if steps.height == 0:
        return acts
    rows = query_file(con, "run_parameters", [run_id]).to_pylist()
    parameters = step_parameter_frame({run_id: parameter_groups(rows)}, acts.schema["rank"]).drop("run_id")
    steps = steps.cast({"rank": acts.schema["rank"], "event_id": acts.schema["event_id"]})
    joined = acts.join(steps, on=["rank", "event_id"], how="left", maintain_order="left")
    joined = joined.join(parameters, on="rank", how="left", maintain_order="left")
    in_step = pl.col("optimizer_step").is_not_null()
    return joined.with_columns(
        pl.when(in_step).then(pl.col(c)).otherwise(None).alias(c) for c in ("step_params", "step_tensors", "step_dtype")
    )


def pair_unmatched_p2p(collectives: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Pair send/recv rows the decoder could not match because their peer is unknown (gloo p2p
    without process-group arguments): when exactly two ranks hold unmatched p2p rows, the k-th send
    of one pairs with the k-th recv of the other. Returns the rows and how many were paired."""
    if collectives.height == 0:
        return collectives, 0
    loose = collectives.filter(pl.col("match_id").is_null() & pl.col("name").is_in(["send", "recv"]))
    ranks = loose["rank"].unique().to_list()
    if len(ranks) != 2:
        return collectives, 0
    loose = loose.with_columns(
        pl.int_range(pl.len()).over("rank", "name", order_by=["ts_ns", "event_id"]).alias("_k"),
        pl.when(pl.col("name") == "send")
        .then(pl.col("rank"))
        .otherwise(ranks[0] + ranks[1] - pl.col("rank"))
        .alias("_sender"),
    )
    top = collectives["match_id"].max()
    base = (int(top) if isinstance(top, int) else 0) + 1
    keys = (
        loose.group_by("_sender", "_k")
        .agg(pl.len().alias("_n"), pl.col("name").n_unique().alias("_names"), pl.col("ts_ns").min().alias("_t"))
        .filter((pl.col("_n") == 2) & (pl.col("_names") == 2))
        .sort("_t")
        .with_row_index("_m")
        .select("_sender", "_k", (pl.col("_m").cast(pl.Int64) + base).alias("_match"))
    )
    ids = loose.join(keys, on=["_sender", "_k"], how="inner").select("rank", "event_id", "_match")
    out = collectives.join(ids, on=["rank", "event_id"], how="left").with_columns(
        pl.coalesce("match_id", "_match").alias("match_id"),
        pl.when(pl.col("_match").is_not_null() & pl.col("peer").is_null())
        .then(ranks[0] + ranks[1] - pl.col("rank"))
        .otherwise(pl.col("peer"))
        .cast(collectives.schema["peer"])
        .alias("peer"),
    )
    return out.drop("_match"), ids.height


def write_results(
    con: duckdb.DuckDBPyConnection,
    *,
    run_id: str,
    cluster: str | None,
    mode: str,
    predictions: pl.DataFrame,
    components: pl.DataFrame,
) -> None:
    """Replace the ``predictions`` and ``components`` rows of (run, cluster, mode) in one transaction.

    The frames are ``run.result_tables`` rows (both replays, with ``replay`` and ``unexplained_ns``);
    rows of one replay without those columns are taken as the fitted replay's."""
    extra = {"run_id": run_id, "cluster": cluster, "mode": mode}
    pred = _with_replay(predictions).with_columns(pl.lit(v, pl.String).alias(k) for k, v in extra.items())
    comp = _with_replay(components).with_columns(pl.lit(v, pl.String).alias(k) for k, v in extra.items())
    pred_arrow = pred.select(PREDICTIONS.column_names).to_arrow()
    comp_arrow = comp.select(COMPONENTS.column_names).to_arrow()
    con.execute("BEGIN TRANSACTION")
    try:
        for table in ("predictions", "components"):
            con.execute(
                f"DELETE FROM {table} WHERE run_id = ? AND cluster IS NOT DISTINCT FROM ? AND mode = ?",
                [run_id, cluster, mode],
            )
        con.register("_pred", pred_arrow)
        con.register("_comp", comp_arrow)
        con.execute(f"INSERT INTO predictions SELECT {', '.join(PREDICTIONS.column_names)} FROM _pred")
        con.execute(f"INSERT INTO components SELECT {', '.join(COMPONENTS.column_names)} FROM _comp")
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    finally:
        for name in ("_pred", "_comp"):
            con.unregister(name)


def _with_replay(frame: pl.DataFrame) -> pl.DataFrame:
    if "replay" not in frame.columns:
        frame = frame.with_columns(pl.lit("fitted").alias("replay"))
    if "unexplained_ns" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, pl.Int64).alias("unexplained_ns"))
    return frame


def predict_stored_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    *,
    mode: str = "measured",
    model: DurationModel | None = None,
    scale: Mapping[str, float] | None = None,
    iteration: int | None = None,
    replay: str = "fitted",
    compare: bool = True,
    gpus_per_node: int | None = None,
    fallback: Mapping[str, float] | None = None,
) -> tuple[StoredIteration, Prediction]:
    """Load an iteration of a stored run and replay it (``replay``; with ``compare`` the other replay
    too); storing the result is the caller's step (``store_prediction``). ``gpus_per_node``
    places the ranks on nodes of that size (a what-if on another machine): each collective's topology
    follows. ``fallback``: family -> factor for operators no model covers (``durations.predicted``).

    Raises:
        RunNotFoundError, PredictionError: see ``load_iteration`` and ``predict_iteration``.
    """
    stored = load_iteration(con, run_id, iteration)
    if gpus_per_node is not None:
        stored = replace(
            stored,
            inputs=replace(stored.inputs, collectives=group_topology(stored.inputs.collectives, gpus_per_node)),
        )
    prediction = predict_iteration(
        stored.inputs, mode=mode, model=model, scale=scale, replay=replay, compare=compare, fallback=fallback
    )
    return stored, prediction


def store_prediction(
    con: duckdb.DuckDBPyConnection, run_id: str, prediction: Prediction, *, cluster: str | None = None
) -> None:
    """Replace the run's stored results of the prediction's mode with both replays' rows
    (``cluster`` is recorded for predicted mode only)."""
    predictions, components = result_tables(prediction)
    write_results(
        con,
        run_id=run_id,
        cluster=cluster if prediction.mode == "predicted" else None,
        mode=prediction.mode,
        predictions=predictions,
        components=components,
    )

"""One prediction: build the graph of an iteration, pick durations, replay, and tabulate (pure)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from tracecal.errors import PredictionError
from tracecal.predict import durations as dmod
from tracecal.predict import replay as rmod
from tracecal.predict import slack
from tracecal.predict.components import component_table, error_pct_expr, prediction_rows
from tracecal.predict.graph import ReplayGraph, ReplayInputs, build_graph
from tracecal.predict.replay import REPLAYS


@dataclass(frozen=True)
class Prediction:
    """The result of replaying one iteration.

    Attributes:
        mode: measured, predicted or scaled.
        graph: the dependency graph.
        durations: the durations the replay used.
        replayed: replayed point times (ns, relative to ``graph.origin_ns``).
        components: ``component_table`` rows (rank, component, measured_ns, predicted_ns, error_pct,
            covered_share).
        predictions: ``prediction_rows`` (one per operator).
        coverage: share of operator time predicted by a model, overall (``all``) and per family.
        seconds: wall time of the stages (graph, replay, tables).
        replay: which replay made ``replayed`` (``fitted`` or ``dependency``, see ``replay.REPLAYS``).
        unexplained: the absorbed slack on each rank's critical path of a fitted replay
            (``slack.UNEXPLAINED_SCHEMA``); empty for the dependency replay, which has none.
        other: the same durations through the other replay, when it was computed.
    """

    mode: str
    graph: ReplayGraph
    durations: dmod.Durations
    replayed: np.ndarray
    components: pl.DataFrame
    predictions: pl.DataFrame
    coverage: dict[str, float]
    seconds: dict[str, float] = field(default_factory=dict)
    replay: str = "fitted"
    unexplained: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=slack.UNEXPLAINED_SCHEMA))
    other: Prediction | None = None

    def iteration_error(self) -> pl.DataFrame:
        """Per rank: measured and replayed iteration time and the error %."""
        return self.components.filter(pl.col("component") == "iteration").select(
            "rank", "measured_ns", "predicted_ns", "error_pct"
        )

    def by_replay(self, kind: str) -> Prediction | None:
        """This prediction or ``other``, whichever is the ``kind`` replay (None when not computed)."""
        if self.replay == kind:
            return self
        return self.other if self.other is not None and self.other.replay == kind else None


def predict_iteration(
    inputs: ReplayInputs | ReplayGraph,
    *,
    mode: str = "measured",
    model: dmod.DurationModel | None = None,
    scale: Mapping[str, float] | None = None,
    replay: str = "fitted",
    compare: bool = True,
    fallback: Mapping[str, float] | None = None,
) -> Prediction:
    """Replay one iteration.

    Args:
        inputs: graph inputs, or an already built graph (reused across modes).
        mode: ``measured`` (trace durations), ``predicted`` (``model`` required), or ``scaled``
            (measured durations times ``scale`` per family).
        model: calibrated duration model for ``predicted``.
        scale: family -> factor for ``scaled`` (also accepted with ``predicted``: applied on top).
        replay: ``fitted`` (absorbed slack kept as lags) or ``dependency`` (left out).
        compare: also replay the same durations the other way (``Prediction.other``).
        fallback: family -> factor for operators the model leaves uncovered (``predicted`` only;
            ``durations.predicted``).

    Raises:
        PredictionError: unknown mode or replay, missing model or scale, inconsistent graph.
    """
    if mode not in dmod.MODES:
        raise PredictionError(f"unknown mode {mode!r}; use one of {', '.join(dmod.MODES)}")
    if replay not in REPLAYS:
        raise PredictionError(f"unknown replay {replay!r}; use one of {', '.join(REPLAYS)}")
    t0 = time.perf_counter()
    graph = inputs if isinstance(inputs, ReplayGraph) else build_graph(inputs)
    t1 = time.perf_counter()
    if mode == "predicted":
        if model is None:
            raise PredictionError("predicted mode needs calibrated models: pass --cluster NAME")
        dur = dmod.predicted(graph, model, fallback)
        if scale:
            dur = dmod.scaled(graph, scale, base=dur)
            dur = dmod.Durations(dur.dur_ns, dur.source, "predicted")
    elif mode == "scaled":
        if not scale:
            raise PredictionError("scaled mode needs at least one --scale FAMILY=FACTOR")
        dur = dmod.scaled(graph, scale)
    else:
        dur = dmod.measured(graph)
    _ = graph.schedule  # topological order, computed once per graph
    t2 = time.perf_counter()
    first = _replayed(graph, mode, dur, replay)
    other = None
    if compare:
        other = _replayed(graph, mode, dur, REPLAYS[1 - REPLAYS.index(replay)])
    t3 = time.perf_counter()
    seconds = {"graph": t1 - t0, "schedule": t2 - t1, "replay": first.seconds["replay"], "tables": t3 - t2}
    return replace(first, other=other, seconds=seconds)


def _replayed(graph: ReplayGraph, mode: str, dur: dmod.Durations, kind: str) -> Prediction:
    """One replay of ``graph`` with ``dur`` and its tables (``seconds`` holds the replay's own time)."""
    durations_ns = None if mode == "measured" else dur.dur_ns
    t0 = time.perf_counter()
    replayed = rmod.replay(graph, durations_ns, kind)
    t1 = time.perf_counter()
    absorbed = pl.DataFrame(schema=slack.UNEXPLAINED_SCHEMA)
    if kind == "fitted":
        absorbed = slack.unexplained(graph, replayed, rmod.edge_lags(graph, durations_ns, kind))
    return Prediction(
        mode=mode,
        graph=graph,
        durations=dur,
        replayed=replayed,
        components=component_table(graph, replayed, dur),
        predictions=prediction_rows(graph, replayed, dur),
        coverage=dmod.coverage(graph, dur),
        seconds={"replay": t1 - t0},
        replay=kind,
        unexplained=absorbed,
    )


def result_tables(prediction: Prediction) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The ``predictions`` and ``components`` rows of every replay computed (the prediction's own and
    ``other``), each with ``replay`` and ``unexplained_ns`` (0 where no absorbed slack landed).

    Measured times are the prediction's own for both replays: a caller may have replaced them (a
    decoded run is measured by its published iteration), and both replays are scored against them.
    """
    measured = prediction.components.select("rank", "component", "measured_ns")
    preds, comps = [], []
    for p in (prediction, prediction.other):
        if p is None:
            continue
        c = p.components
        if p is not prediction:
            c = (
                c.drop("measured_ns", "error_pct")
                .join(measured, on=["rank", "component"], how="left", maintain_order="left")
                .with_columns(error_pct_expr())
                .select(prediction.components.columns)
            )
        kind = pl.lit(p.replay).alias("replay")
        comps.append(
            c.join(
                slack.by_component(p.unexplained), on=["rank", "component"], how="left", maintain_order="left"
            ).with_columns(pl.col("unexplained_ns").fill_null(0), kind)
        )
        preds.append(
            p.predictions.join(
                slack.by_operator(p.unexplained), on=["rank", "event_id"], how="left", maintain_order="left"
            ).with_columns(pl.col("unexplained_ns").fill_null(0), kind)
        )
    return pl.concat(preds), pl.concat(comps)


def slack_report(prediction: Prediction) -> pl.DataFrame:
    """Per rank and component (the rows of ``components``): ``dependency_error_pct``, the dependency
    replay's error (NULL when it was not computed or gives the component no time), and
    ``unexplained_pct``, the absorbed slack on the fitted replay's critical path landing before that
    component's operators as a share of the rank's fitted iteration (the ``iteration`` row: all of
    it; NULL when the fitted replay was not computed)."""
    _, comps = result_tables(prediction)
    keys = prediction.components.select("rank", "component")
    dep = comps.filter(pl.col("replay") == "dependency").select(
        "rank",
        "component",
        # a component the dependency replay gives no time (its idle, where gaps are nominal lags) has no error
        pl.when(pl.col("predicted_ns") > 0).then(pl.col("error_pct")).alias("dependency_error_pct"),
    )
    fit = comps.filter(pl.col("replay") == "fitted")
    span = fit.filter(pl.col("component") == "iteration").select("rank", pl.col("predicted_ns").alias("_span"))
    share = fit.join(span, on="rank", how="left").select(
        "rank",
        "component",
        pl.when(pl.col("_span") > 0).then(100.0 * pl.col("unexplained_ns") / pl.col("_span")).alias("unexplained_pct"),
    )
    return keys.join(dep, on=["rank", "component"], how="left", maintain_order="left").join(
        share, on=["rank", "component"], how="left", maintain_order="left"
    )

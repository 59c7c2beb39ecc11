"""One prediction: build the graph of an iteration, pick durations, replay, and tabulate (pure)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from tracecal.errors import PredictionError
from tracecal.predict import durations as dmod
from tracecal.predict.components import component_table, prediction_rows
from tracecal.predict.graph import ReplayGraph, ReplayInputs, build_graph
from tracecal.predict.replay import replay


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
    """

    mode: str
    graph: ReplayGraph
    durations: dmod.Durations
    replayed: np.ndarray
    components: pl.DataFrame
    predictions: pl.DataFrame
    coverage: dict[str, float]
    seconds: dict[str, float] = field(default_factory=dict)

    def iteration_error(self) -> pl.DataFrame:
        """Per rank: measured and replayed iteration time and the error %."""
        return self.components.filter(pl.col("component") == "iteration").select(
            "rank", "measured_ns", "predicted_ns", "error_pct"
        )


def predict_iteration(
    inputs: ReplayInputs | ReplayGraph,
    *,
    mode: str = "measured",
    model: dmod.DurationModel | None = None,
    scale: Mapping[str, float] | None = None,
) -> Prediction:
    """Replay one iteration.

    Args:
        inputs: graph inputs, or an already built graph (reused across modes).
        mode: ``measured`` (trace durations), ``predicted`` (``model`` required), or ``scaled``
            (measured durations times ``scale`` per family).
        model: calibrated duration model for ``predicted``.
        scale: family -> factor for ``scaled`` (also accepted with ``predicted``: applied on top).

    Raises:
        PredictionError: unknown mode, missing model or scale, inconsistent graph.
    """
    if mode not in dmod.MODES:
        raise PredictionError(f"unknown mode {mode!r}; use one of {', '.join(dmod.MODES)}")
    t0 = time.perf_counter()
    graph = inputs if isinstance(inputs, ReplayGraph) else build_graph(inputs)
    t1 = time.perf_counter()
    if mode == "predicted":
        if model is None:
            raise PredictionError("predicted mode needs calibrated models: pass --cluster NAME")
        dur = dmod.predicted(graph, model)
        if scale:
            dur = dmod.scaled(graph, scale, base=dur)
            dur = dmod.Durations(dur.dur_ns, dur.source, "predicted")
    elif mode == "scaled":
        if not scale:
            raise PredictionError("scaled mode needs at least one --scale FAMILY=FACTOR")
        dur = dmod.scaled(graph, scale)
    else:
        dur = dmod.measured(graph)
    replay_durations = None if mode == "measured" else dur.dur_ns
    _ = graph.schedule  # topological order, computed once per graph
    t2 = time.perf_counter()
    replayed = replay(graph, replay_durations)
    t3 = time.perf_counter()
    comps = component_table(graph, replayed, dur)
    preds = prediction_rows(graph, replayed, dur)
    t4 = time.perf_counter()
    return Prediction(
        mode=mode,
        graph=graph,
        durations=dur,
        replayed=replayed,
        components=comps,
        predictions=preds,
        coverage=dmod.coverage(graph, dur),
        seconds={"graph": t1 - t0, "schedule": t2 - t1, "replay": t3 - t2, "tables": t4 - t3},
    )

"""Discrete-event replay of a dependency graph: every point happens at the latest of its constraints.

The graph is static (per-thread and per-stream order are those of the trace), so the simulation is a
single pass in topological order: one vectorised numpy step per topological level, which is about
the length of the longest chain (a few times the operators of one rank), not the number of points.
"""

from __future__ import annotations

import numpy as np

from tracecal.errors import PredictionError
from tracecal.predict.edges import NO_TIME
from tracecal.predict.graph import ReplayGraph

REPLAYS = ("fitted", "dependency")
"""``fitted``: the lags keep the slack the fit absorbed (the measured replay is exact);
``dependency``: only dependencies and nominal lags (the absorbed slack left out)."""


def edge_lags(graph: ReplayGraph, durations_ns: np.ndarray | None, kind: str = "fitted") -> np.ndarray:
    """The graph's lags for a replay of ``kind`` (see ``REPLAYS``), with the duration edges of ``own``
    nodes replaced by ``durations_ns``.

    Args:
        graph: a built graph.
        durations_ns: one int64 duration per node (ns), or None for the measured durations.
        kind: ``fitted`` or ``dependency``.

    Raises:
        PredictionError: unknown ``kind``.
    """
    if kind not in REPLAYS:
        raise PredictionError(f"unknown replay {kind!r}; use one of {', '.join(REPLAYS)}")
    if durations_ns is None and kind == "fitted":
        return graph.lag
    lag = graph.lag.copy()
    if kind == "dependency":
        lag[graph.absorbed.edge] -= graph.absorbed.ns
    if durations_ns is not None:
        own = (graph.nodes["duration_role"] == "own").to_numpy()  # compared in polars: no Python strings
        edges = graph.duration_edge[own]
        lag[edges] = np.asarray(durations_ns, dtype=np.int64)[own]
    return lag


def replay(graph: ReplayGraph, durations_ns: np.ndarray | None = None, kind: str = "fitted") -> np.ndarray:
    """Replay the graph; returns the time of every point (start ``2·node``, end ``2·node+1``), ns
    relative to the graph's origin. The ``fitted`` replay with ``durations_ns=None`` reproduces the
    measured times; the ``dependency`` replay leaves out the slack the fit absorbed."""
    lag = edge_lags(graph, durations_ns, kind)
    sched = graph.schedule
    t = graph.release.copy()
    bounds = sched.level_bounds
    # edges laid out round by round (the schedule keeps src and dst in that order), so each round is
    # three contiguous slices
    src, dst, lag = sched.src, sched.dst, lag[sched.edge_order]
    for i in range(bounds.size - 1):
        a, b = bounds[i], bounds[i + 1]
        np.maximum.at(t, dst[a:b], t[src[a:b]] + lag[a:b])
    if (t == NO_TIME).any():  # every point is a root or has an incoming edge; guard against misuse
        raise PredictionError("replay left points without a time: the graph was modified after building")
    return t

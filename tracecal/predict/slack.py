"""Unexplained slack: the part of a replayed iteration that the dependency graph does not explain (pure).

The fit (``edges._fit_lags``) adds each point's unexplained delay to one incoming edge. In the fitted
replay that slack is a fixed lag: it stays the same however the durations change. Its effect on an
iteration is read off the replay's *critical path*: from the rank's last point, follow the edge that
set each point's time (its binding edge) back to the rank's iteration start. Every absorbed slack on
that path is time of the iteration the graph cannot explain: the *unexplained* time. It is an upper
bound on how much the dependency replay (the slack left out) shortens the iteration.

The path can cross ranks (a rank waits for a collective whose last member was late on another rank),
so a rank's unexplained time may land before another rank's operator.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracecal.predict.components import node_components
from tracecal.predict.graph import ReplayGraph

UNEXPLAINED_SCHEMA = {
    "rank": pl.Int32,
    "node": pl.Int64,
    "point": pl.String,
    "slack_ns": pl.Int64,
    "node_rank": pl.Int32,
    "event_id": pl.Int64,
    "node_kind": pl.String,
    "name": pl.String,
    "family": pl.String,
    "component": pl.String,
}
"""Columns of ``unexplained``: the path's rank, the node and point (start/end) the slack lands before,
the slack (ns, clipped to the rank's iteration), and that node's rank, event id, kind, name, family
and component (NULL for runtime calls, collective instances and markers)."""


def binding_edges(graph: ReplayGraph, times: np.ndarray, lag: np.ndarray) -> np.ndarray:
    """Per point, the in-edge that set its time in a replay (``times`` from ``lag``); -1 for roots.

    Where several edges tie, one that carries absorbed slack is taken (the slack did delay the point),
    else the last one."""
    src, dst = graph.src, graph.dst
    tight = np.flatnonzero(times[src] + lag == times[dst])
    carries = np.zeros(src.size, dtype=bool)
    carries[graph.absorbed.edge] = True
    # numpy's fancy assignment keeps the last write of a repeated index: slack edges go last
    tight = tight[np.argsort(carries[tight], kind="stable")]
    parent = np.full(times.size, -1, dtype=np.int64)
    parent[dst[tight]] = tight
    return parent


def _path_ends(graph: ReplayGraph, times: np.ndarray) -> pl.DataFrame:
    """Per rank: the point that ends its iteration span (latest end of a span node) and the span start."""
    nodes = graph.nodes
    span = nodes["in_span"].to_numpy()
    frame = pl.DataFrame(
        {
            "rank": nodes["rank"].to_numpy()[span],
            "end_point": 2 * nodes["node"].to_numpy()[span] + 1,
            "start": times[0::2][span],
            "end": times[1::2][span],
        }
    )
    return (
        frame.sort("end", "end_point")
        .group_by("rank")
        .agg(pl.col("end_point").last(), pl.col("start").min())
        .sort("rank")
    )


def unexplained(graph: ReplayGraph, times: np.ndarray, lag: np.ndarray) -> pl.DataFrame:
    """The absorbed slack on each rank's critical path in a fitted replay (``UNEXPLAINED_SCHEMA``).

    Args:
        graph: a built graph.
        times: the replay's point times (``replay(graph, durations, "fitted")``).
        lag: the lags that replay used (``edge_lags(graph, durations, "fitted")``).

    Every rank's path is walked at once, one numpy step per point of the longest path.
    """
    if graph.absorbed.edge.size == 0:
        return pl.DataFrame(schema=UNEXPLAINED_SCHEMA)
    parent = binding_edges(graph, times, lag)
    ends = _path_ends(graph, times)
    rank = ends["rank"].to_numpy()
    floor = ends["start"].to_numpy()
    cur = ends["end_point"].to_numpy().astype(np.int64)
    lane = np.arange(rank.size)
    abs_edge, abs_ns = graph.absorbed.edge, graph.absorbed.ns
    hits: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    while lane.size:
        edge = parent[cur]
        go = (edge >= 0) & (times[cur] > floor[lane])
        lane, cur, edge = lane[go], cur[go], edge[go]
        at = np.minimum(np.searchsorted(abs_edge, edge), abs_edge.size - 1)
        hit = abs_edge[at] == edge
        if hit.any():
            ns = np.minimum(abs_ns[at[hit]], times[cur[hit]] - floor[lane[hit]])
            hits.append((lane[hit], cur[hit], ns))
        cur = graph.src[edge].astype(np.int64)
    if not hits:
        return pl.DataFrame(schema=UNEXPLAINED_SCHEMA)
    lanes, points, ns = (np.concatenate(parts) for parts in zip(*hits, strict=True))
    node = points // 2
    nodes = graph.nodes
    comp = node_components(graph)[node]
    return pl.DataFrame(
        {
            "rank": rank[lanes],
            "node": node,
            "point": np.where(points % 2 == 0, "start", "end"),
            "slack_ns": ns,
            "node_rank": nodes["rank"].to_numpy()[node],
            "event_id": nodes["event_id"].to_numpy()[node],
            "node_kind": nodes["node_kind"].to_numpy()[node],
            "name": nodes["name"].to_numpy()[node],
            "family": nodes["family"].to_numpy()[node],
            "component": comp,
        },
        schema=UNEXPLAINED_SCHEMA,
    ).sort("rank", "node", "point")


def by_component(slack: pl.DataFrame) -> pl.DataFrame:
    """Per rank and component: ``unexplained_ns`` landing before that component's operators, and an
    ``iteration`` row with the rank's whole unexplained time (which also counts slack before runtime
    calls, collective instances and markers, points that have no component)."""
    comp = (
        slack.filter(pl.col("component").is_not_null())
        .group_by("rank", "component")
        .agg(pl.col("slack_ns").sum().alias("unexplained_ns"))
    )
    total = slack.group_by("rank").agg(
        pl.lit("iteration").alias("component"), pl.col("slack_ns").sum().alias("unexplained_ns")
    )
    return pl.concat([comp, total.select(comp.columns)]).sort("rank", "component")


def by_operator(slack: pl.DataFrame) -> pl.DataFrame:
    """Per operator (rank, event_id): ``unexplained_ns`` on its own rank's critical path before it."""
    return (
        slack.filter((pl.col("node_kind") == "activity") & (pl.col("node_rank") == pl.col("rank")))
        .group_by("rank", "event_id")
        .agg(pl.col("slack_ns").sum().alias("unexplained_ns"))
    )


def landing(slack: pl.DataFrame, top: int = 3) -> pl.DataFrame:
    """Per rank, the ``top`` kinds of points the unexplained time lands before, largest first:
    rank, what (an operator family's start/end, or a runtime call's name), unexplained_ns."""
    what = (
        pl.when(pl.col("node_kind") == "activity")
        .then(pl.col("family").fill_null("other"))
        .when(pl.col("node_kind") == "runtime")
        .then(pl.col("name"))
        .otherwise(pl.col("node_kind"))
        + pl.lit(" ")
        + pl.col("point")
    )
    return (
        slack.group_by("rank", what.alias("what"))
        .agg(pl.col("slack_ns").sum().alias("unexplained_ns"))
        .sort(["rank", "unexplained_ns", "what"], descending=[False, True, False])
        .group_by("rank", maintain_order=True)
        .head(top)
    )

"""Dependency graph of one iteration across all ranks (see docs/replay.md), as timed points and lagged edges.

Every node (a GPU activity, a CPU operator, a runtime call, a collective instance, an iteration
marker, a stream's carry-in) is two points: its start ``2·node`` and its end ``2·node + 1``. An edge
``src → dst`` with lag ``ℓ`` says "``dst`` happens no earlier than ``src + ℓ``"; a point happens at the
latest of its incoming constraints (a root at its measured time). The edges:

=============  ============================================================================  =========
kind           meaning                                                                       lag
=============  ============================================================================  =========
duration       start → end of a node                                                         its duration
thread         previous CPU op on the thread → next (measured gap kept)                      gap
stream         previous activity on a GPU stream → next (the first after the stream's        ≤ gap, 0
               carry-in: the end of the earlier work it ran before the iteration)
launch         runtime call start → the activity it launched (correlation)                   ≤ launch latency
sync           awaited GPU activity end → end of a blocking call (device/stream synchronize,  return latency
               synchronous memcpy)
event_wait     activity before a ``cudaStreamWaitEvent`` → next activity launched after it   0
coll_join      each member's start → the collective instance's start (the last member)       0
coll_end       the instance's end → each member's end (they end together)                    clock skew
issue          CPU op that enqueued async work → its start on a worker thread (gloo)          measured
wait           worker-thread collective end → the next op of a thread blocked on it          measured
marker         iteration start → first op; last op → iteration end (CPU-only ranks)          gap
=============  ============================================================================  =========

Lags are taken from the measured trace as ``min(measured difference, nominal)`` (the *dependency*
lags) and then the binding edge of every point absorbs whatever is left unexplained (``absorbed``),
so the *fitted* replay with measured durations reproduces every measured time exactly; the
*dependency* replay leaves the absorbed slack out, so its error with measured durations is what the
dependencies alone miss. What changes in a prediction is only the durations (of operators and of
collective transfers), and each point then follows its dependencies.

Times are aligned across ranks (``ts_ns + ranks.clock_offset_ns``) and made relative to the earliest
point of the graph. Everything is built with vectorised frame/array operations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import polars as pl

from tracecal.errors import PredictionError
from tracecal.predict.edges import EDGE_KINDS, Absorbed, infer_edges
from tracecal.vocabulary import GPU_ACTIVITY_KINDS

CARRY_IN_SCHEMA = {"rank": pl.Int64, "stream": pl.Int64, "busy_until_ns": pl.Int64}
"""``ReplayInputs.carry_in``: per GPU stream, the end of the work it ran before the iteration."""


@dataclass(frozen=True)
class ReplayInputs:
    """What the graph is built from: one iteration of one run, all ranks (frames are polars).

    Attributes:
        activities: one row per operator of the iteration (``operators`` rows): rank, event_id, kind,
            name, ts_ns, dur_ns, stream, cpu_tid, runtime_event_id, family, component, plus any
            feature columns the duration models need (kept, not interpreted here). Collective members
            that are not operators (e.g. a gloo op missing from ``operators``) are added by the loader.
        collectives: ``collectives`` rows of the iteration: rank, event_id, match_id, name, role,
            plus communication features. Members are joined to activities on (rank, event_id).
        runtime: CPU runtime/driver calls of the iteration window (GPU traces): rank, event_id, name,
            ts_ns, dur_ns, tid. Empty for CPU-only traces.
        ranks: one row per rank: rank, clock_offset_ns, window_start_ns, window_end_ns (the
            iteration marker on the CPU), main_tid (the marker's thread; NULL when unknown).
        carry_in: per GPU stream (rank, stream, busy_until_ns): when the stream finished the work it
            ran before the iteration's first activity on it (rank clock). Empty when unknown (the
            iteration's first activity on a stream then waits only for its launch).
    """

    activities: pl.DataFrame
    collectives: pl.DataFrame
    runtime: pl.DataFrame
    ranks: pl.DataFrame
    carry_in: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=CARRY_IN_SCHEMA))


@dataclass(frozen=True)
class ReplayGraph:
    """A built graph. ``nodes`` has one row per node in node order with columns node, rank,
    node_kind (activity, runtime, collective, marker), event_id, name, family, component, kind,
    role, match_id, start_ns, end_ns (measured, aligned, relative to ``origin_ns``), dur_ns,
    duration_role (own: its duration edge is the operator's duration and may be predicted;
    coupled: a collective member whose end follows the instance; sync: a blocking call; fixed),
    in_span (the node bounds its rank's iteration span), plus the activity feature columns.

    Edge arrays are aligned: ``src``/``dst`` point ids, ``lag`` ns, ``edge_kind`` index into
    ``EDGE_KINDS``. ``duration_edge[node]`` is the index of the node's start → end edge.
    """

    nodes: pl.DataFrame
    src: np.ndarray
    dst: np.ndarray
    lag: np.ndarray
    edge_kind: np.ndarray
    duration_edge: np.ndarray
    origin_ns: int
    release: np.ndarray = field(repr=False)
    features: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    """Per activity/collective node (``node`` column): the activity's other columns (phase, shapes,
    dtypes ...) and, for collective instances, collective/size_bytes/group_size/nodes/gpus_per_node."""
    absorbed: Absorbed = field(
        repr=False, default_factory=lambda: Absorbed(np.empty(0, np.int64), np.empty(0, np.int64))
    )
    """The slack the fit added to ``lag`` (a delay the dependencies leave unexplained): the fitted
    replay keeps it, the dependency replay leaves it out."""

    @property
    def n_points(self) -> int:
        return 2 * self.nodes.height

    @cached_property
    def measured_times(self) -> np.ndarray:
        """Measured time of every point (start, end interleaved), relative ns."""
        t = np.empty(self.n_points, dtype=np.int64)
        t[0::2] = self.nodes["start_ns"].to_numpy()
        t[1::2] = self.nodes["end_ns"].to_numpy()
        return t

    @cached_property
    def schedule(self) -> Schedule:
        """Topological levels of the points (computed once, reused by every replay)."""
        return topological_schedule(self.n_points, self.src, self.dst)

    def edge_counts(self) -> dict[str, int]:
        counts = np.bincount(self.edge_kind, minlength=len(EDGE_KINDS))
        return {name: int(c) for name, c in zip(EDGE_KINDS, counts, strict=True)}


@dataclass(frozen=True)
class Schedule:
    """Edges in rounds of Kahn's algorithm: ``edge_order[level_bounds[i]:level_bounds[i + 1]]`` are
    the out-edges of the points that became ready in round ``i`` (round 0: the roots). ``src`` and
    ``dst`` are the graph's edge ends already in that order (every replay reads them)."""

    edge_order: np.ndarray
    level_bounds: np.ndarray
    roots: np.ndarray
    src: np.ndarray = field(repr=False, default_factory=lambda: np.empty(0, np.int64))
    dst: np.ndarray = field(repr=False, default_factory=lambda: np.empty(0, np.int64))


# --- building ----------------------------------------------------------------------------------------


def build_graph(inputs: ReplayInputs) -> ReplayGraph:
    """Build the dependency graph of one iteration (see the module docstring for the edges).

    Node ids: the activities first, in the order of ``inputs.activities`` (node ``i`` is activity row
    ``i``), then the runtime calls in their order, the collective instances by ``match_id``, the
    iteration markers, and the carry-in of each stream still busy with earlier work.

    Raises:
        PredictionError: no activities, a node without a time (NULL ``ts_ns``, or NULL iteration
            window of a CPU-only rank), or the constraints form a cycle.
    """
    if inputs.activities.height == 0:
        raise PredictionError("the iteration has no operators to replay; was the run decoded?")
    inputs = _normalized(inputs)
    offsets = inputs.ranks.select("rank", pl.col("clock_offset_ns").fill_null(0).cast(pl.Int64).alias("_offset"))
    nodes = _node_table(inputs, offsets)
    if nodes["start_ns"].null_count() or nodes["end_ns"].null_count():
        # numpy would turn the NULL into a garbage time and the replay would carry it silently
        bad = nodes.filter(pl.col("start_ns").is_null() | pl.col("end_ns").is_null()).row(0, named=True)
        raise PredictionError(
            f"rank {bad['rank']}: {bad['node_kind']} {bad['name']!r} has no time (NULL ts_ns or iteration "
            "window); re-decode the run (`trace-ingest RUN`)"
        )
    origin = int(nodes["start_ns"].min())  # type: ignore[arg-type]
    nodes = nodes.with_columns(pl.col("start_ns") - origin, pl.col("end_ns") - origin)

    builder, coupled, sync = infer_edges(nodes)
    # a blocking call's end follows the awaited work (sync wins over coupled, as in the rules' order)
    nodes = nodes.with_columns(
        pl.when(pl.Series(sync)).then(pl.lit("sync")).when(pl.Series(coupled)).then(pl.lit("coupled"))
        .otherwise(pl.col("duration_role")).alias("duration_role")
    )  # fmt: skip
    features = _features(inputs, nodes)
    src, dst, lag, kind, release, absorbed = builder.fitted()
    del builder
    return ReplayGraph(
        nodes=nodes,
        src=src,
        dst=dst,
        lag=lag,
        edge_kind=kind,
        duration_edge=np.arange(nodes.height, dtype=np.int64),
        origin_ns=origin,
        release=release,
        features=features,
        absorbed=absorbed,
    )


def _features(inputs: ReplayInputs, nodes: pl.DataFrame) -> pl.DataFrame:
    """Per activity and collective node: the columns a duration model may use (node-keyed).

    Activities keep their other ``operators`` columns; those that are collective rows also get the
    collective's name and communication features (an unmatched NCCL kernel is still a collective);
    collective instances get them from their first member (in ``collectives`` order). The activity
    columns are not copied: activity ``i`` is node ``i``, so the frame is the activities' own columns
    beside a narrow join, and already in node order."""
    acts = inputs.activities
    keep = [c for c in acts.columns if c not in FEATURE_EXCLUDE and c not in ("rank", "event_id")]
    comm_cols = [c for c in COMM_FEATURES if c in inputs.collectives.columns]
    coll = inputs.collectives.select(
        "rank", "event_id", "match_id", pl.col("name").alias("collective"), *comm_cols
    ).unique(["rank", "event_id"], keep="first", maintain_order=True)
    shared = [c for c in comm_cols if c in acts.columns]  # operators has dtype too: prefer the op's own
    member = acts.select("rank", "event_id").join(
        coll.drop(*shared), on=["rank", "event_id"], how="left", maintain_order="left"
    )
    n_acts = acts.height
    frame = pl.concat(
        [
            acts.select(keep),
            member.drop("rank", "event_id", "match_id", *[c for c in member.columns if c in keep]),
            nodes.slice(0, n_acts).select("node"),
        ],
        how="horizontal",
    )
    inst = nodes.lazy().filter(pl.col("node_kind") == "collective").select("node", "match_id").collect()
    if inst.height:
        first = coll.filter(pl.col("match_id").is_not_null()).unique("match_id", keep="first", maintain_order=True)
        inst = inst.join(first.drop("rank", "event_id"), on="match_id", how="left", maintain_order="left")
    inst = inst.drop("match_id").with_columns(pl.lit("comm").alias("family"))
    # activities are nodes 0..n_acts-1 and instances come after every activity: already in node order
    return pl.concat([frame, inst], how="diagonal_relaxed")


_NODE_COLUMNS = (
    "rank", "event_id", "kind", "name", "ts_ns", "dur_ns", "stream", "tid", "runtime_event_id", "family", "component",
)  # fmt: skip
"""Activity columns the graph itself uses; every other column is a feature for the duration models."""

FEATURE_EXCLUDE = ("run_id", "ts_ns", "runtime_ts_ns", "runtime_dur_ns", "cpu_op_ts_ns", "cpu_op_dur_ns")
"""Activity columns not worth carrying as features (times of this particular trace)."""

COMM_FEATURES = ("size_bytes", "group_size", "nodes", "gpus_per_node", "dtype")
"""Collective columns handed to the communication model with each instance."""

_KEY_TYPES = {
    "rank": pl.Int64,
    "event_id": pl.Int64,
    "match_id": pl.Int64,
    "ts_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "tid": pl.Int64,
    "cpu_tid": pl.Int64,
    "stream": pl.Int64,
    "runtime_event_id": pl.Int64,
    "name": pl.String,
    "role": pl.String,
    "family": pl.String,
    "component": pl.String,
    "kind": pl.String,
    "main_tid": pl.Int64,
    "clock_offset_ns": pl.Int64,
    "window_start_ns": pl.Int64,
    "window_end_ns": pl.Int64,
    "busy_until_ns": pl.Int64,
}


def _normalized(inputs: ReplayInputs) -> ReplayInputs:
    """Cast the columns the graph joins and computes on to one type (frames from SQL, Arrow or code)."""

    def cast(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.with_columns(pl.col(c).cast(t) for c, t in _KEY_TYPES.items() if c in frame.columns)

    frames = (inputs.activities, inputs.collectives, inputs.runtime, inputs.ranks, inputs.carry_in)
    return ReplayInputs(*(cast(f) for f in frames))


def _by_rank(table: pl.DataFrame, column: str) -> pl.Expr:
    """``column`` of ``table`` (one row per rank) looked up by each row's rank: a column-wise map,
    so the (wide, long) frame it is used on is not joined and copied; NULL for an unknown rank."""
    table = table.filter(pl.col("rank").is_not_null()).unique("rank", keep="first", maintain_order=True)
    return pl.col("rank").replace_strict(table["rank"], table[column], default=None, return_dtype=table.schema[column])


def _node_table(inputs: ReplayInputs, offsets: pl.DataFrame) -> pl.DataFrame:
    """All nodes of the graph with measured aligned times (absolute) and their lanes; activities
    first, in input order (node ``i`` is activity row ``i``)."""
    acts = inputs.activities
    if "tid" not in acts.columns:
        acts = acts.with_columns(pl.col("cpu_tid").alias("tid"))
    # only what the edges and tables need travels with the nodes; features stay in ReplayGraph.features
    acts = acts.select([c for c in _NODE_COLUMNS if c in acts.columns])
    is_gpu = pl.col("kind").is_in(GPU_ACTIVITY_KINDS)
    offset = _by_rank(offsets, "_offset").fill_null(0)
    acts = acts.with_columns(
        pl.lit("activity").alias("node_kind"),
        (pl.col("ts_ns") + offset).alias("start_ns"),
        pl.col("dur_ns").fill_null(0).clip(lower_bound=0).alias("dur_ns"),
        pl.when(is_gpu).then(pl.col("stream")).otherwise(None).cast(pl.Int64).alias("lane_stream"),
        pl.when(is_gpu).then(None).otherwise(pl.col("tid")).cast(pl.Int64).alias("lane_tid"),
        pl.col("runtime_event_id").cast(pl.Int64)
        if "runtime_event_id" in acts.columns
        else pl.lit(None, pl.Int64).alias("runtime_event_id"),
        pl.lit("own").alias("duration_role"),
    )
    # collective membership: (rank, event_id) -> match_id, role; joined on the two keys only (the
    # result is in activity order, one row per activity) and set beside the activity columns
    coll = inputs.collectives.select(
        "rank",
        "event_id",
        pl.col("match_id").cast(pl.Int64),
        pl.col("role").cast(pl.String),
        pl.col("name").alias("coll_name"),
    ).unique(subset=["rank", "event_id"], keep="first", maintain_order=True)
    member = acts.select("rank", "event_id").join(coll, on=["rank", "event_id"], how="left", maintain_order="left")
    acts = pl.concat([acts, member.drop("rank", "event_id")], how="horizontal")
    acts = acts.with_columns((pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))

    gpu_ranks = acts.lazy().filter(is_gpu).select("rank").unique().collect()
    acts = acts.with_columns(
        pl.when(pl.col("rank").is_in(gpu_ranks["rank"].implode())).then(is_gpu).otherwise(False).alias("in_span")
    )

    rt = inputs.runtime
    if rt.height:
        rt = rt.select(
            "rank",
            pl.col("event_id").cast(pl.Int64),
            "name",
            (pl.col("ts_ns") + _by_rank(offsets, "_offset").fill_null(0)).alias("start_ns"),
            pl.col("dur_ns").fill_null(0).clip(lower_bound=0).alias("dur_ns"),
            pl.col("tid").cast(pl.Int64).alias("lane_tid"),
        ).with_columns(
            (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
            pl.lit("runtime").alias("node_kind"),
            pl.lit("fixed").alias("duration_role"),
            pl.lit(False).alias("in_span"),
        )

    # one virtual node per matched collective instance; its times are filled by _collective_edges
    members = (
        acts.lazy()
        .filter(pl.col("match_id").is_not_null())
        .select("match_id", "rank", "coll_name", "role", "start_ns", "end_ns")
        .collect()
    )
    inst = (
        members.group_by("match_id")
        .agg(
            pl.col("rank").min(),
            pl.col("coll_name").first().alias("name"),
            pl.col("role").first(),
            pl.col("start_ns").max().alias("_last_start"),
            pl.col("end_ns").max().alias("_last_end"),
            pl.len().alias("members"),
        )
        .select(
            "rank",
            "match_id",
            "name",
            "role",
            "members",
            pl.col("_last_start").alias("start_ns"),
            pl.col("_last_end").alias("end_ns"),
            (pl.col("_last_end") - pl.col("_last_start")).alias("dur_ns"),
            pl.lit("collective").alias("node_kind"),
            pl.lit("comm").alias("family"),
            pl.lit("own").alias("duration_role"),
            pl.lit(False).alias("in_span"),
        )
        .sort("match_id")
    )

    # CPU-only ranks: the iteration marker is the span (start and end points of two marker nodes)
    cpu_ranks = inputs.ranks.filter(~pl.col("rank").is_in(gpu_ranks["rank"].implode()))
    markers = pl.DataFrame()
    if cpu_ranks.height:
        cr = cpu_ranks.with_columns(_by_rank(offsets, "_offset").alias("_offset")).with_columns(
            (pl.col("window_start_ns") + pl.col("_offset")).alias("_s"),
            (pl.col("window_end_ns") + pl.col("_offset")).alias("_e"),
        )
        markers = pl.concat(
            [
                cr.select(
                    "rank",
                    pl.col("_s").alias("start_ns"),
                    pl.col("_s").alias("end_ns"),
                    pl.lit("iteration_start").alias("name"),
                    pl.col("main_tid").cast(pl.Int64).alias("lane_tid"),
                ),
                cr.select(
                    "rank",
                    pl.col("_e").alias("start_ns"),
                    pl.col("_e").alias("end_ns"),
                    pl.lit("iteration_end").alias("name"),
                    pl.col("main_tid").cast(pl.Int64).alias("lane_tid"),
                ),
            ]
        ).with_columns(
            pl.lit(0, pl.Int64).alias("dur_ns"),
            pl.lit("marker").alias("node_kind"),
            pl.lit("fixed").alias("duration_role"),
            pl.lit(True).alias("in_span"),
        )

    acts = acts.with_columns(
        ((pl.col("family") == "comm").fill_null(False) | pl.col("match_id").is_not_null()).alias("is_comm")
    )
    frames = [acts.drop("coll_name"), rt, inst, markers, _carry_in_nodes(inputs.carry_in, acts, offsets)]
    return _stack([f for f in frames if f.height], main_tid=_by_rank(inputs.ranks, "main_tid"))


def _carry_in_nodes(carry_in: pl.DataFrame, acts: pl.DataFrame, offsets: pl.DataFrame) -> pl.DataFrame:
    """One ``carry_in`` node per GPU stream that was still busy with earlier work (the previous
    iteration's tail) when the iteration's first activity on it was launched: a point at the time the
    stream became free (aligned, at most the first activity's start), first in the stream's order, so
    the first activity cannot start before it in any replay. Its time is measured and fixed."""
    if carry_in.height == 0:
        return pl.DataFrame()
    first = (
        acts.lazy()
        .filter(pl.col("lane_stream").is_not_null())
        .group_by("rank", pl.col("lane_stream").alias("stream"))
        .agg(pl.col("start_ns").min().alias("_first"))
        .collect()
    )
    at = (pl.col("busy_until_ns") + _by_rank(offsets, "_offset").fill_null(0)).clip(upper_bound=pl.col("_first"))
    return (
        carry_in.drop_nulls()
        .join(first, on=["rank", "stream"], how="inner")
        .select(
            "rank",
            at.alias("start_ns"),
            at.alias("end_ns"),
            pl.lit(0, pl.Int64).alias("dur_ns"),
            pl.lit("stream busy before the iteration").alias("name"),
            pl.col("stream").alias("lane_stream"),
            pl.lit("carry_in").alias("node_kind"),
            pl.lit("fixed").alias("duration_role"),
            pl.lit(False).alias("in_span"),
        )
        .sort("rank", "lane_stream")
    )


def _stack(frames: list[pl.DataFrame], *, main_tid: pl.Expr) -> pl.DataFrame:
    """Frames one under the other, columns in order of first appearance (as a diagonal concat), a
    column a frame lacks being NULL, then ``is_comm`` (NULL → false), ``main_tid`` and ``node`` (the
    row number). Each frame is completed before stacking, so every column of the result is chunked
    alike: a diagonal concat chunks columns differently, and polars may then copy the whole (large)
    table into single chunks at the next ``with_columns``."""
    schema = pl.concat([f.head(0) for f in frames], how="diagonal_relaxed").schema
    parts, first = [], 0
    for f in frames:
        parts.append(
            f.select(pl.col(c).cast(t) if c in f.columns else pl.lit(None, t).alias(c) for c, t in schema.items())
            .with_columns(pl.col("is_comm").fill_null(False), main_tid.alias("main_tid"))
            .with_columns(pl.int_range(first, first + f.height, dtype=pl.Int64).alias("node"))
        )
        first += f.height
    return pl.concat(parts, how="vertical")


# --- ordering ------------------------------------------------------------------------------------------


def topological_schedule(n_points: int, src: np.ndarray, dst: np.ndarray) -> Schedule:
    """Kahn's algorithm, one numpy pass per round (rounds ≈ the longest chain, not the point count).

    Round ``r`` emits the out-edges of the points that became ready in round ``r - 1``; all of those
    points' in-edges were emitted earlier, so replaying the edges round by round only ever reads final
    times.

    Raises:
        PredictionError: the edges form a cycle.
    """
    indeg = np.bincount(dst, minlength=n_points).astype(np.int64)
    out_count = np.bincount(src, minlength=n_points)
    offsets = np.concatenate([[0], np.cumsum(out_count)])
    by_src = np.argsort(src, kind="stable")
    frontier = np.flatnonzero(indeg == 0)
    roots = frontier
    chunks: list[np.ndarray] = []
    done = frontier.size
    while frontier.size:
        counts = out_count[frontier]
        total = int(counts.sum())
        if total == 0:
            break
        first = np.repeat(offsets[frontier] - np.cumsum(counts) + counts, counts)
        edges = by_src[first + np.arange(total)]
        chunks.append(edges)
        targets = dst[edges]
        np.subtract.at(indeg, targets, 1)
        ready = targets[indeg[targets] == 0]
        # deduplicate without sorting: the last write of a distinct stamp per point wins
        stamp = -np.arange(1, ready.size + 1)
        indeg[ready] = stamp
        frontier = ready[indeg[ready] == stamp]
        done += frontier.size
    if done != n_points:
        raise PredictionError(
            f"the dependency graph has a cycle through {n_points - done} points; "
            "the trace's ordering is inconsistent (report this run)"
        )
    edge_order = np.concatenate(chunks) if chunks else np.empty(0, np.int64)
    if edge_order.size and src.size < np.iinfo(np.int32).max:
        edge_order = edge_order.astype(np.int32)  # edge ids fit: half the memory
    level_bounds = np.concatenate([[0], np.cumsum([c.size for c in chunks])]).astype(np.int64)
    return Schedule(
        edge_order=edge_order, level_bounds=level_bounds, roots=roots, src=src[edge_order], dst=dst[edge_order]
    )

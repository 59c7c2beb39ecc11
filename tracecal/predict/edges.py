"""The rules that infer the edges of the dependency graph (see ``tracecal.predict.graph``).

Each rule reads the node table (one row per node, measured aligned times) and adds edges with a
*nominal* lag; ``EdgeBuilder.fitted`` then sets every lag to ``min(measured difference, nominal)`` and
lets the binding edge of every point absorb what is left, which makes the measured replay exact. What
was absorbed is returned beside the lags, so a replay can leave it out (the dependency replay).
Rules are vectorised (polars joins, as-of joins and numpy), never a Python loop over events.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import polars as pl

EDGE_KINDS = (
    "duration", "thread", "stream", "launch", "sync", "event_wait",
    "coll_join", "coll_end", "issue", "wait", "marker",
)  # fmt: skip
"""Edge kind names; ``ReplayGraph.edge_kind`` holds indexes into this tuple."""
_K = {name: i for i, name in enumerate(EDGE_KINDS)}


BLOCKING_CALL = re.compile(
    r"Synchronize|^(cuda|hip)Memcpy(2D|3D)?$|^(cuda|hip)Memset$|^(cuda|hip)Free$|^cuMemcpy[DH]to[DH]$"
)
"""Runtime calls that block the CPU until earlier GPU work finishes (their end waits for it)."""

SYNC_COPY = re.compile(r"DtoH.*Pageable")
"""GPU activities whose launching call returns only once they are done: copies to pageable host
memory (``Memcpy DtoH (Device -> Pageable)`` in Kineto and Nsight traces)."""

STREAM_WAIT = re.compile(r"StreamWaitEvent")
"""Runtime calls that make a stream wait for work recorded on another stream."""

WAIT_SHARE = 0.25
"""A worker-thread collective ending while a thread is idle is taken as what the thread waited for
(an un-traced ``work.wait()``) when the thread resumes within this share of its idle gap."""

INF = np.iinfo(np.int64).max // 4
NO_TIME = np.iinfo(np.int64).min // 4


class EdgeBuilder:
    """Accumulates edges as (src point, dst point, nominal lag, kind); lags are fitted at the end."""

    def __init__(self, nodes: pl.DataFrame) -> None:
        self.n = nodes.height
        self.start = nodes["start_ns"].to_numpy()
        self.end = nodes["end_ns"].to_numpy()
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []
        self.sync_nodes = np.zeros(self.n, dtype=bool)
        self.duration_nominal = nodes["dur_ns"].to_numpy().astype(np.int64).copy()
        empty = np.empty(0, np.int64)
        self.thread_pairs: tuple[np.ndarray, np.ndarray] = (empty, empty)  # (prev node, node)
        self.launch_pairs: tuple[np.ndarray, np.ndarray] | None = None  # (runtime node, activity)
        self.waiting_nodes = empty  # ops that waited for a worker collective
        self.typical_gap = 0

    @property
    def point_dtype(self) -> type[np.signedinteger]:
        """Point ids are int32 while they fit (half the memory and bandwidth of the edge arrays)."""
        return np.int32 if 2 * self.n < np.iinfo(np.int32).max else np.int64

    def add(self, src: np.ndarray, dst: np.ndarray, nominal: np.ndarray | int, kind: str) -> None:
        src = np.asarray(src, dtype=self.point_dtype)
        dst = np.asarray(dst, dtype=self.point_dtype)
        if src.size == 0:
            return
        nom = np.broadcast_to(np.asarray(nominal, dtype=np.int64), src.shape)
        self.parts.append((src, dst, nom, _K[kind]))

    def fitted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Absorbed]:
        """All edges, duration edges first (edge ``i`` is node ``i``'s start → end), with fitted lags.
        Consumes the accumulated edges (the builder is empty afterwards).

        Returns:
            (src, dst, lag, kind, release, absorbed): point ids (int32 while they fit, else int64),
            lags ns (absorbed slack included), kind indexes into ``EDGE_KINDS``, per point its
            release time (measured time for roots, ``NO_TIME`` otherwise), and the slack absorbed.
        """
        n = self.n
        total = n + sum(p[0].size for p in self.parts)
        src = np.empty(total, dtype=self.point_dtype)
        dst = np.empty(total, dtype=self.point_dtype)
        lag = np.empty(total, dtype=np.int64)  # the nominal lags first, fitted in place below
        kind = np.empty(total, dtype=np.int8)
        src[:n] = np.arange(0, 2 * n, 2, dtype=self.point_dtype)
        np.add(src[:n], 1, out=dst[:n])
        lag[:n] = self.duration_nominal
        kind[:n] = _K["duration"]
        at = n
        parts, self.parts = self.parts, []
        for p_src, p_dst, p_nom, p_kind in parts:
            end = at + p_src.size
            src[at:end], dst[at:end], lag[at:end], kind[at:end] = p_src, p_dst, p_nom, p_kind
            at = end
        del parts
        t = np.empty(2 * n, dtype=np.int64)
        t[0::2] = self.start
        t[1::2] = self.end
        release, absorbed = _fit_lags(t, src, dst, lag)
        return src, dst, lag, kind, release, absorbed


def infer_edges(nodes: pl.DataFrame) -> tuple[EdgeBuilder, np.ndarray, np.ndarray]:
    """Run every rule over the node table.

    Returns:
        The builder (call ``fitted()``) and two per-node masks for the duration role after the rules:
        collective members whose end follows their instance (``coupled``) and blocking runtime calls
        whose end follows the awaited work (``sync``; it wins where both hold).
    """
    b = EdgeBuilder(nodes)
    _thread_edges(b, nodes)
    _stream_and_launch_edges(b, nodes)
    _sync_edges(b, nodes)
    _event_wait_edges(b, nodes)
    coupled = np.zeros(b.n, dtype=bool)
    coupled[_collective_edges(b, nodes)] = True
    _marker_edges(b, nodes)
    _issue_and_wait_edges(b, nodes)  # last: it relaxes thread and marker edges into waiting ops
    return b, coupled, b.sync_nodes


_CHUNK = 1 << 20
"""Edges per slice when fitting lags: slice-sized scratch arrays are reused by the allocator, where
edge-sized ones would be fresh memory (costly to touch, on a VM above all)."""


class Absorbed(NamedTuple):
    """Slack the fit added to lags: ``edge`` ids (one per point the graph could not explain, sorted)
    and ``ns`` added to each. ``lag[edge] - ns`` are the dependency lags ``min(measured, nominal)``."""

    edge: np.ndarray
    ns: np.ndarray


def _fit_lags(t: np.ndarray, src: np.ndarray, dst: np.ndarray, lag: np.ndarray) -> tuple[np.ndarray, Absorbed]:
    """Fit the lags in place, given the nominal ones: ``lag = min(t[dst] - t[src], nominal)``, then
    each point's unexplained delay goes to its binding edge, so measured replay is exact.

    A point whose latest constraint ``max(t[src] + lag)`` falls short of its measured time gets the
    difference added to the lag of one edge that attains that maximum (the last such edge).

    Returns:
        The release time of every point (its measured time for a root, i.e. a point without in-edge,
        else ``NO_TIME``) and the absorbed slack.
    """
    best = np.full(t.size, NO_TIME, dtype=np.int64)  # latest constraint per point
    for a in range(0, src.size, _CHUNK):
        s_t = t[src[a : a + _CHUNK]]
        d = dst[a : a + _CHUNK]
        sub = lag[a : a + _CHUNK]
        np.minimum(sub, t[d] - s_t, out=sub)
        s_t += sub
        np.maximum.at(best, d, s_t)
    short = best < t  # roots (no in-edge) are never a dst, so they are never looked up below
    edges = np.flatnonzero(short[dst])
    edges = edges[t[src[edges]] + lag[edges] == best[dst[edges]]]
    binding = np.full(t.size, -1, dtype=np.int64)
    binding[dst[edges]] = edges  # one binding edge per point (the last of the tied ones)
    points = np.flatnonzero(short & (binding >= 0))
    absorbed = Absorbed(binding[points], t[points] - best[points])
    lag[absorbed.edge] += absorbed.ns
    root = best == NO_TIME
    best[root] = t[root]  # the array becomes the release times
    best[~root] = NO_TIME
    order = np.argsort(absorbed.edge, kind="stable")
    return best, Absorbed(absorbed.edge[order], absorbed.ns[order])


def chain_predecessors(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For rows sorted by (group, start): the index of the earlier row of the same group with the
    latest end (the op a thread or stream was busy with last), or -1 for a group's first row."""
    n = group.size
    if n == 0:
        return np.empty(0, dtype=np.int64)
    new_group = np.empty(n, dtype=bool)
    new_group[0] = True
    np.not_equal(group[1:], group[:-1], out=new_group[1:])
    # running max of end per group: offset each group so a global accumulate cannot leak across groups
    lowest = end.min()
    span = int(end.max() - lowest) + 1
    shifted = np.cumsum(new_group, dtype=np.int64)
    shifted *= span
    shifted += end
    shifted -= lowest
    running = np.maximum.accumulate(shifted)
    holder = np.where(shifted == running, np.arange(n), -1)  # rows that hold their group's max end
    del shifted, running
    np.maximum.accumulate(holder, out=holder)
    prev = np.empty(n, dtype=np.int64)
    prev[0] = -1
    prev[1:] = holder[:-1]
    prev[new_group] = -1
    return prev


def dense_ids(values: np.ndarray) -> tuple[np.ndarray, int]:
    """(index of each value among the sorted distinct values, number of distinct values). The
    distinct values are found by hashing (few: ranks, threads, streams), then each value is looked
    up in a table over the value range when it is small, else by binary search; ``np.unique(...,
    return_inverse=True)`` would sort every value."""
    if values.size == 0:
        return np.empty(0, dtype=np.int64), 0
    distinct = np.sort(pl.Series(values).unique().to_numpy())
    lo, hi = int(distinct[0]), int(distinct[-1])
    if hi - lo < max(4 * values.size, 1 << 16):
        table = np.zeros(hi - lo + 1, dtype=np.int64)
        table[distinct - lo] = np.arange(distinct.size)
        return table[values - lo], distinct.size
    return np.searchsorted(distinct, values).astype(np.int64), distinct.size


def lane_ids(rank: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """A dense int64 id per (rank, lane) pair, ordered by rank then lane."""
    rank_i, _ = dense_ids(rank)
    lane_i, n_lanes = dense_ids(lane)
    return rank_i * n_lanes + lane_i


def _lane_chain(nodes: pl.DataFrame, mask: pl.Expr, lane: str) -> tuple[np.ndarray, np.ndarray]:
    """(prev node, node) pairs of consecutive nodes on each (rank, lane)."""
    sub = (
        nodes.lazy()  # lazy: only the five columns are filtered, not the whole node table
        .filter(mask & pl.col(lane).is_not_null())
        .select("node", pl.col("rank").fill_null(pl.col("rank").min() - 1), lane, "start_ns", "end_ns")
        .collect()
    )
    if sub.height == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    start = sub["start_ns"].to_numpy()
    end = sub["end_ns"].to_numpy()
    key = lane_ids(sub["rank"].to_numpy(), sub[lane].to_numpy())
    # by (rank, lane, start, end); a numpy lexsort of three int64 keys is several times faster than a
    # polars multi-column sort here, and stable (exact ties keep node order)
    order = np.lexsort((end, start, key))
    prev = chain_predecessors(key[order], start[order], end[order])
    node = sub["node"].to_numpy()[order]
    ok = prev >= 0
    return node[prev[ok]], node[ok]


def join_on_rank_and_id(left: pl.DataFrame, right: pl.DataFrame, id_col: str) -> pl.DataFrame:
    """Inner join on (rank, ``id_col``), in ``left`` order. Both keys are packed into one int64 when
    they fit (a single-key join is about twice as fast as a two-key one on millions of rows)."""
    if left.height == 0 or right.height == 0:
        return left.join(right, on=["rank", id_col], how="inner", maintain_order="left")
    ranks = np.sort(pl.concat([left["rank"], right["rank"]]).drop_nulls().unique().to_numpy())
    ids = pl.concat([left[id_col], right[id_col]]).drop_nulls()
    lo, hi = ids.min(), ids.max()
    span = int(hi) - int(lo) + 1 if ids.len() else 1  # type: ignore[arg-type]
    if ranks.size == 0 or ranks.size * span >= 2**62:
        return left.join(right, on=["rank", id_col], how="inner", maintain_order="left")

    rank_i = pl.col("rank").replace_strict(ranks, np.arange(ranks.size), default=None, return_dtype=pl.Int64)
    key = (rank_i * span + (pl.col(id_col) - lo)).alias("_key")
    joined = left.with_columns(key).join(
        right.with_columns(key).drop("rank", id_col), on="_key", how="inner", maintain_order="left"
    )
    return joined.drop("_key")


def _thread_edges(b: EdgeBuilder, nodes: pl.DataFrame) -> None:
    """CPU order per thread: runtime calls (GPU ranks) or compute operators (CPU-only ranks; their
    communication ops are asynchronous work hung off the thread by issue/wait edges)."""
    cpu = (pl.col("node_kind") == "runtime") | (
        (pl.col("node_kind") == "activity") & pl.col("lane_stream").is_null() & ~pl.col("is_comm")
    )
    prev, node = _lane_chain(nodes, cpu, "lane_tid")
    b.add(2 * prev + 1, 2 * node, INF, "thread")
    b.thread_pairs = (prev, node)


def _stream_and_launch_edges(b: EdgeBuilder, nodes: pl.DataFrame) -> None:
    """Stream order (a stream's carry-in, the end of the work it ran before the iteration, comes
    first) and launches (runtime call → the activity it launched)."""
    on_stream = pl.col("node_kind").is_in(["activity", "carry_in"]) & pl.col("lane_stream").is_not_null()
    prev, node = _lane_chain(nodes, on_stream, "lane_stream")
    b.add(2 * prev + 1, 2 * node, 0, "stream")
    gpu = pl.col("node_kind").eq("activity") & pl.col("lane_stream").is_not_null()

    rt = (
        nodes.lazy()
        .filter(pl.col("node_kind") == "runtime")
        .select(
            "rank",
            pl.col("event_id").alias("runtime_event_id"),
            pl.col("node").alias("rt_node"),
            pl.col("start_ns").alias("rt_start"),
        )
        .collect()
    )
    if rt.height == 0:
        return
    acts = (
        nodes.lazy()
        .filter(gpu & pl.col("runtime_event_id").is_not_null())
        .select("node", "rank", "runtime_event_id", "start_ns")
        .collect()
    )
    launched = join_on_rank_and_id(acts, rt, "runtime_event_id")
    if launched.height == 0:
        return
    # launch latency per rank: median over activities whose stream was idle when they were launched
    prev_end = np.full(nodes.height, NO_TIME, dtype=np.int64)
    prev_end[node] = b.end[prev]
    lat = launched.with_columns(
        (pl.col("start_ns") - pl.col("rt_start")).alias("_lat"),
        # the stream was already empty when the launch call began: the delay is launch latency
        (pl.Series(prev_end[launched["node"].to_numpy()]) < pl.col("rt_start")).alias("_idle"),
    )
    nominal = lat.join(
        lat.filter(pl.col("_idle") & (pl.col("_lat") >= 0))
        .group_by("rank")
        .agg(pl.col("_lat").median().cast(pl.Int64).alias("_nominal")),
        on="rank",
        how="left",
        maintain_order="left",  # row i must stay launch i: polars promises no order otherwise
    )["_nominal"].fill_null(0)
    b.add(2 * lat["rt_node"].to_numpy(), 2 * lat["node"].to_numpy(), nominal.to_numpy(), "launch")
    b.launch_pairs = (lat["rt_node"].to_numpy(), lat["node"].to_numpy())


def _launched(b: EdgeBuilder, nodes: pl.DataFrame) -> pl.DataFrame | None:
    """Launched activities: act, rank, launching thread, stream, launch time, end; sorted by launch."""
    if b.launch_pairs is None:
        return None
    rt_nodes, act_nodes = b.launch_pairs
    return pl.DataFrame(
        {
            "act": act_nodes,
            "rank": nodes["rank"].gather(act_nodes),
            "lane_tid": nodes["lane_tid"].gather(rt_nodes),
            "stream": nodes["lane_stream"].gather(act_nodes),
            "l_ts": b.start[rt_nodes],
            "act_end": b.end[act_nodes],
        }
    ).sort("l_ts", maintain_order=True)  # ties (one call, several launches) in launch-pair order


def _runtime_calls(nodes: pl.DataFrame, pattern: re.Pattern[str]) -> pl.LazyFrame:
    """The runtime-call nodes whose name matches ``pattern`` (the regex runs once per distinct name,
    not once per call)."""
    rt = nodes.lazy().filter(pl.col("node_kind") == "runtime")
    names = rt.select(pl.col("name").unique()).collect()["name"]
    return rt.filter(pl.col("name").is_in(names.filter(names.str.contains(pattern.pattern)).implode()))


def _sync_edges(b: EdgeBuilder, nodes: pl.DataFrame) -> None:
    """A blocking runtime call ends after the activity it waited for: the latest-ending activity
    launched before it, when that one ended while the call was blocked (else no edge: the call
    waited for nothing, or for one stream while another was still busy). Its own duration becomes
    the return latency, so the wait counts once: a shorter or longer awaited activity moves its end.

    Blocking calls are those named so (``BLOCKING_CALL``) and any call whose launched copy to pageable
    host memory (``SYNC_COPY``: ``.item()``, ``.cpu()``) finished before it returned: such a copy is
    synchronous whatever the call's name. (A fast kernel or memset that ends before its launch call
    returns is no wait.)"""
    launched = _launched(b, nodes)
    if launched is None:
        return
    rt_nodes, act_nodes = b.launch_pairs  # type: ignore[misc]
    names = nodes["name"].gather(act_nodes)
    distinct = names.unique()
    copies = names.is_in(distinct.filter(distinct.str.contains(SYNC_COPY.pattern)).implode())
    own = copies.to_numpy() & (b.end[act_nodes] <= b.end[rt_nodes])
    waited_for_own = np.unique(rt_nodes[own])
    blocking = (
        pl.concat(
            [
                _runtime_calls(nodes, BLOCKING_CALL).select("node").collect(),
                pl.DataFrame({"node": waited_for_own}, schema={"node": pl.Int64}),
            ]
        )
        .unique("node")
        .join(nodes.select("node", "rank", "start_ns", "end_ns"), on="node", how="inner")
    )
    if blocking.height == 0:
        return
    # running max of the end over launch order per rank, with the activity that holds it
    run = launched.with_columns(pl.col("act_end").cum_max().over("rank").alias("max_end"))
    run = run.with_columns(
        pl.when(pl.col("act_end") == pl.col("max_end")).then(pl.col("act")).otherwise(None).alias("holder")
    ).with_columns(pl.col("holder").forward_fill().over("rank"))
    cand = (
        blocking.sort("start_ns")
        .join_asof(
            run.select("rank", "l_ts", "max_end", "holder"),
            left_on="start_ns",
            right_on="l_ts",
            by="rank",
            strategy="backward",
            check_sortedness=False,
        )
        .filter(
            pl.col("holder").is_not_null()
            & (pl.col("max_end") >= pl.col("start_ns"))
            & (pl.col("max_end") <= pl.col("end_ns"))
        )
    )
    if cand.height == 0:
        return
    sync = cand["node"].to_numpy()
    ret = (cand["end_ns"] - cand["max_end"]).to_numpy()
    b.add(2 * cand["holder"].to_numpy() + 1, 2 * sync + 1, INF, "sync")
    b.duration_nominal[sync] = np.minimum(b.duration_nominal[sync], ret)
    b.sync_nodes[sync] = True


def _event_wait_edges(b: EdgeBuilder, nodes: pl.DataFrame) -> None:
    """``cudaStreamWaitEvent``: the next activity launched by the thread waits for the activity last
    launched on another stream of the rank before the call (what the recorded event marks)."""
    launched = _launched(b, nodes)
    if launched is None:
        return
    waits = (
        _runtime_calls(nodes, STREAM_WAIT)
        .select("rank", "lane_tid", pl.col("start_ns").alias("w_ts"))
        .drop_nulls(["rank", "lane_tid"])  # a call on no known thread precedes nothing
        .collect()
    )
    if waits.height == 0:
        return
    following = launched.select(
        "rank", "lane_tid", "l_ts", pl.col("act").alias("next_act"), pl.col("stream").alias("next_s")
    ).drop_nulls("lane_tid")
    waits, following = _with_packed_key(waits, following, ("rank", "lane_tid"))
    nxt = (
        waits.sort("w_ts")
        .join_asof(
            following.drop("rank", "lane_tid"),
            left_on="w_ts",
            right_on="l_ts",
            by="_key",
            strategy="forward",
            check_sortedness=False,
        )
        .drop_nulls("next_act")
        .select("rank", "w_ts", "next_act", "next_s")
    )
    if nxt.height == 0:
        return
    # the last activity launched before the wait on each other stream of the rank (few streams),
    # then the latest of those
    streams = launched.select("rank", "stream").unique()
    per_stream = nxt.join(streams, on="rank", how="inner").filter(pl.col("stream") != pl.col("next_s"))
    per_stream, earlier = _with_packed_key(
        per_stream, launched.select("rank", "stream", "l_ts", "act"), ("rank", "stream")
    )
    found = (
        per_stream.sort("w_ts")
        .join_asof(
            earlier.drop("rank", "stream"),
            left_on="w_ts",
            right_on="l_ts",
            by="_key",
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .drop_nulls("act")
    )
    if found.height == 0:
        return
    # per (next activity, wait): the candidate launched last (ties: the higher node id)
    next_act, w_ts = found["next_act"].to_numpy(), found["w_ts"].to_numpy()
    act = found["act"].to_numpy()
    order = np.lexsort((act, found["l_ts"].to_numpy(), w_ts, next_act))
    next_act, w_ts, act = next_act[order], w_ts[order], act[order]
    last = np.r_[(next_act[1:] != next_act[:-1]) | (w_ts[1:] != w_ts[:-1]), True]
    dep, nxt_act = act[last], next_act[last]
    ok = b.end[dep] <= b.start[nxt_act]  # an inferred dependency the trace contradicts is dropped
    b.add(2 * dep[ok] + 1, 2 * nxt_act[ok], 0, "event_wait")


def _with_packed_key(
    left: pl.DataFrame, right: pl.DataFrame, cols: tuple[str, str]
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Both frames with ``_key``: one int64 per value pair of the two ``cols`` (no NULLs), the same
    in both frames, for an as-of join ``by`` a single column (faster than by two)."""
    a, b = cols
    both = pl.concat([left.select(a, b), right.select(a, b)])
    key = lane_ids(both[a].to_numpy(), both[b].to_numpy())
    return (
        left.with_columns(pl.Series("_key", key[: left.height])),
        right.with_columns(pl.Series("_key", key[left.height :])),
    )


def _collective_edges(b: EdgeBuilder, nodes: pl.DataFrame) -> np.ndarray:
    """Members join the instance (it starts when the last is ready) and end with it.

    Returns the member nodes whose end now follows the instance (duration role ``coupled``)."""
    inst = (
        nodes.lazy().filter(pl.col("node_kind") == "collective").select(pl.col("node").alias("inst"), "match_id")
    ).collect()
    if inst.height == 0:
        return np.empty(0, np.int64)
    mem = (
        nodes.lazy()
        .filter((pl.col("node_kind") == "activity") & pl.col("match_id").is_not_null())
        .select("node", "match_id")
        .join(inst.lazy(), on="match_id", how="inner", maintain_order="left")
        .collect()
    )
    m = mem["node"].to_numpy()
    c = mem["inst"].to_numpy()
    b.add(2 * m, 2 * c, 0, "coll_join")
    # a member that finished before the last member even started did not wait for the transfer
    # (an eager send); the others end when the instance ends, give or take clock skew
    tied = b.end[m] >= b.start[c]
    b.add(2 * c[tied] + 1, 2 * m[tied] + 1, INF, "coll_end")
    b.duration_nominal[m[tied]] = 0
    return m[tied]


def _issue_and_wait_edges(b: EdgeBuilder, nodes: pl.DataFrame) -> None:
    """CPU-only ranks: communication ops (gloo, on a worker thread or as asynchronous spans on the
    main thread) start after the latest main-thread op that began before them (the op that
    enqueued them), and a main-thread op that resumed right after one ended waited for it."""
    # iteration markers take part: the iteration start can issue work and the iteration end can wait
    cpu = (
        nodes.lazy()
        .filter(
            ((pl.col("node_kind").eq("activity") & pl.col("lane_stream").is_null()) | pl.col("node_kind").eq("marker"))
            & pl.col("main_tid").is_not_null()
        )
        .select("node", "rank", "lane_tid", "main_tid", "is_comm", "start_ns", "end_ns")
        .collect()
    )
    comm = cpu.filter(pl.col("is_comm")).sort("start_ns", maintain_order=True)
    on_main = cpu.filter(pl.col("lane_tid") == pl.col("main_tid")).sort("start_ns", maintain_order=True)
    if comm.height == 0 or on_main.height == 0:
        return
    issuers = on_main.select(
        "rank", pl.col("node").alias("issuer"), pl.col("start_ns").alias("i_ts"), pl.col("end_ns").alias("i_end")
    )
    # strictly earlier start, so an op is never its own issuer; among issuers starting at the same
    # instant the as-of join takes the last in node order (the stable sort above)
    iss = (
        comm.with_columns((pl.col("start_ns") - 1).alias("_probe"))
        .join_asof(issuers, left_on="_probe", right_on="i_ts", by="rank", strategy="backward", check_sortedness=False)
        .drop_nulls("issuer")
    )
    ended = (iss["i_end"] <= iss["start_ns"]).to_numpy()
    issuer = iss["issuer"].to_numpy()
    target = iss["node"].to_numpy()
    # enqueued after the issuer finished: follow its end; enqueued from inside it: follow its start
    b.add(np.where(ended, 2 * issuer + 1, 2 * issuer), 2 * target, INF, "issue")
    chain = on_main.filter(~pl.col("is_comm"))
    if chain.height:
        _wait_edges(b, chain, comm)
        _relax_thread_edges(b)


def _wait_edges(b: EdgeBuilder, main: pl.DataFrame, comm: pl.DataFrame) -> None:
    """The first main-thread op starting after a worker collective ended waited for it (an un-traced
    ``work.wait()``) when the main thread was idle at that moment and resumed within ``WAIT_SHARE``
    of its gap."""
    main_next = main.select(
        "rank",
        pl.col("node").alias("y"),
        pl.col("start_ns").alias("y_ts"),
        pl.col("end_ns").shift(1).over("rank").alias("z_end"),
    )
    comm = comm.sort("end_ns", maintain_order=True)
    w = comm.join_asof(
        main_next, left_on="end_ns", right_on="y_ts", by="rank", strategy="forward", check_sortedness=False
    )
    w = w.drop_nulls("y").filter(
        pl.col("z_end").is_not_null()
        & (pl.col("z_end") <= pl.col("end_ns"))
        & ((pl.col("y_ts") - pl.col("end_ns")) <= WAIT_SHARE * (pl.col("y_ts") - pl.col("z_end")))
    )
    if w.height == 0:
        return
    # equal ends: the last in node order (stable sort), so two builds pick the same collective
    w = w.sort("end_ns", maintain_order=True).group_by("y").agg(pl.col("node").last())
    y = w["y"].to_numpy()
    b.add(2 * w["node"].to_numpy() + 1, 2 * y, INF, "wait")
    # the waiting op's own thread gap is mostly the wait: keep only the thread's typical gap
    thread_prev, thread_node = b.thread_pairs
    gaps = b.start[thread_node] - b.end[thread_prev]
    b.typical_gap = int(np.median(gaps[gaps >= 0])) if (gaps >= 0).any() else 0
    b.waiting_nodes = y


def _relax_thread_edges(b: EdgeBuilder) -> None:
    """Thread edges into ops that waited for communication keep only the thread's typical gap, so a
    shorter (predicted) collective lets the thread resume earlier."""
    relaxed = (_K["thread"], _K["marker"])
    for i, (src, dst, nom, kind) in enumerate(b.parts):
        if kind not in relaxed:
            continue
        nom = nom.copy()
        nom[np.isin(dst // 2, b.waiting_nodes)] = b.typical_gap
        b.parts[i] = (src, dst, nom, kind)


def _marker_edges(b: EdgeBuilder, nodes: pl.DataFrame) -> None:
    """CPU-only ranks: iteration start → first op of the main thread; its last op → iteration end."""
    mk = nodes.lazy().filter(pl.col("node_kind") == "marker").select("node", "rank", "name").collect()
    if mk.height == 0:
        return
    main = (
        nodes.lazy()
        .filter((pl.col("node_kind") == "activity") & (pl.col("lane_tid") == pl.col("main_tid")) & ~pl.col("is_comm"))
        .select("node", "rank", "start_ns", "end_ns")
        .collect()
    )
    first = main.sort("start_ns").group_by("rank").agg(pl.col("node").first().alias("first"))
    last = main.sort("end_ns").group_by("rank").agg(pl.col("node").last().alias("last"))
    starts = mk.filter(pl.col("name") == "iteration_start").join(first, on="rank", how="inner")
    ends = mk.filter(pl.col("name") == "iteration_end").join(last, on="rank", how="inner")
    b.add(2 * starts["node"].to_numpy() + 1, 2 * starts["first"].to_numpy(), INF, "marker")
    b.add(2 * ends["last"].to_numpy() + 1, 2 * ends["node"].to_numpy(), INF, "marker")

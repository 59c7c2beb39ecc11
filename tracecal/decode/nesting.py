"""Interval nesting on CPU threads, vectorised: which interval encloses a point, and how deep.

Profiler events on one thread nest like a call stack. Instead of walking a stack per event (a Python
loop), every question here is answered with one sort and one as-of join:

1. Turn intervals into boundary rows (``+1`` at start, ``-1`` at end) and queries into rows with
   ``0``; sort them by lane (thread), time, and a tie order (ends, then starts outermost first,
   then zero-length ends, then queries); a running sum gives the nesting depth at every row.
2. For properly nested intervals, the interval enclosing a query at depth ``d`` is the last start
   row before it whose depth is ``d`` (innermost) or ``1`` (outermost); a parent of an interval at
   depth ``d`` is the last start row at depth ``d - 1``. That is an as-of join on the row position
   grouped by (lane, depth).

Containment is half-open: an interval [ts, end) encloses t when ts <= t < end; a zero-length interval
encloses nothing. Results are checked for containment afterwards, so a partial overlap (profilers
round timestamps) yields NULL rather than a wrong parent. Times are int64 ns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import polars as pl

_END, _START, _ZERO, _QUERY = 0, 1, 2, 3

ENGINE: Final = "in-memory"
"""Engine for decode's lazy plans: polars' default picks the streaming engine, which costs about
twice the CPU of the in-memory one on frames of a few thousand rows (measured on dlrm's linking)."""


@dataclass(frozen=True)
class _Sweep:
    """The boundary/query rows of ``_boundaries`` as numpy arrays, in sweep order.

    ``src`` is the row of ``intervals`` (start, zero-length and end rows) or of ``points`` (query
    rows) each row comes from; ``lane`` a dense lane number (rows of one lane are contiguous).
    """

    lane: np.ndarray
    order: np.ndarray
    depth: np.ndarray
    src: np.ndarray


def _int_columns(frames: Sequence[pl.DataFrame], col: str) -> np.ndarray | None:
    """One column of several frames as one int64 array (strings as dense codes); None if it has NULLs."""
    series = [f.get_column(col) for f in frames]
    if any(s.null_count() for s in series):
        return None
    if all(s.dtype.is_integer() for s in series):
        return np.concatenate([s.cast(pl.Int64).to_numpy() for s in series])
    return pl.concat([s.cast(pl.Utf8) for s in series]).cast(pl.Categorical).to_physical().cast(pl.Int64).to_numpy()


def _np_sweep(intervals: pl.DataFrame, points: pl.DataFrame | None, lane: Sequence[str]) -> _Sweep | None:
    """``_boundaries`` in numpy: the same rows in the same order; starts of identical intervals
    (polars leaves their order to its unstable sort) in id order, so the larger id is inside.

    Each polars operation has a fixed cost of a fraction of a millisecond that dominates on the
    few thousand events of most traces; numpy's is microseconds. None when a lane, time or
    interval bound is NULL (``_boundaries`` handles those).
    """
    frames = [intervals] if points is None else [intervals, points]
    n_iv = intervals.height
    n_pt = 0 if points is None else points.height
    ts = _int_columns([intervals], "ts_ns")
    end = _int_columns([intervals], "end_ns")
    t_pt = _int_columns([points], "t") if points is not None else np.zeros(0, dtype=np.int64)
    lanes = [_int_columns(frames, c) for c in lane]
    if ts is None or end is None or t_pt is None or any(x is None for x in lanes):
        return None
    zero = end <= ts
    nz = np.flatnonzero(~zero)
    # rows: starts (every interval), ends (non-zero intervals), queries
    keys = [np.concatenate([x[:n_iv], x[:n_iv][nz], x[n_iv:]]) for x in lanes if x is not None]
    t = np.concatenate([ts, end[nz], t_pt])
    order = np.concatenate([np.where(zero, _ZERO, _START), np.full(len(nz), _END), np.full(n_pt, _QUERY)]).astype(
        np.int8
    )
    neg_dur = np.concatenate([ts - end, np.zeros(len(nz) + n_pt, dtype=np.int64)])
    delta = np.concatenate([np.where(zero, 0, 1), np.full(len(nz), -1), np.zeros(n_pt, dtype=np.int64)])
    src = np.concatenate([np.arange(n_iv), nz, np.arange(n_pt)])
    # identical intervals (profilers round times): the later id (file order) is the inner one
    ids = intervals.get_column("id")
    tie = np.zeros(len(src), dtype=np.int64)
    if ids.dtype.is_integer() and not ids.null_count():
        tie[:n_iv] = ids.cast(pl.Int64).to_numpy()
    perm = sweep_order(keys, t, order, neg_dur, tie)
    # every interval opens and closes in its lane, so a lane's deltas sum to 0 and one running sum
    # over the sorted rows is the per-lane depth
    depth = np.cumsum(delta[perm])
    if keys:
        changed = np.zeros(len(perm), dtype=bool)
        for k in keys:
            ks = k[perm]
            changed[1:] |= ks[1:] != ks[:-1]
        lane_no = np.cumsum(changed)
    else:
        lane_no = np.zeros(len(perm), dtype=np.int64)
    return _Sweep(lane=lane_no, order=order[perm], depth=depth, src=src[perm])


def _packed(lanes: Sequence[np.ndarray], t: np.ndarray, order: np.ndarray) -> np.ndarray | None:
    """One int64 per row that sorts as (lanes..., t, order) do; None when it would overflow.

    A lane column becomes an order-preserving code: its offset from the minimum when the values are
    dense (ranks, most pids), else its rank among the distinct values (thread ids)."""
    code, width = np.zeros(len(t), dtype=np.int64), 1
    for x in lanes:
        lo, hi = int(x.min()), int(x.max())
        if hi - lo < max(len(x), 1 << 16):
            values, size = x - lo, hi - lo + 1
        else:
            distinct, values = np.unique(x, return_inverse=True)
            values, size = values.reshape(-1), len(distinct)
        width *= size
        if width >= 2**40:
            return None
        code = code * size + values
    t0 = int(t.min())
    span = int(t.max()) - t0 + 1
    if width * span * 4 >= 2**62:
        return None
    return (code * span + (t - t0)) * 4 + order


def sweep_order(
    lanes: Sequence[np.ndarray], t: np.ndarray, order: np.ndarray, neg_dur: np.ndarray, tie: np.ndarray
) -> np.ndarray:
    """``np.lexsort((tie, neg_dur, order, t, *reversed(lanes)))``, the same permutation from fewer sorts.

    A lexsort sorts once per key (seven here, most of a sweep's cost); the lanes, time and order
    packed into one key (``_packed``) sort once, and only the rows that share a packed key (intervals
    starting together) are sorted further, by ``neg_dur`` and ``tie``. Stable throughout, as the
    lexsort is.
    """
    packed = _packed(lanes, t, order) if len(t) else None
    if packed is None:
        return np.lexsort((tie, neg_dur, order, t, *reversed(lanes)))
    perm = np.argsort(packed, kind="stable")
    sorted_keys = packed[perm]
    same = sorted_keys[1:] == sorted_keys[:-1]
    if same.any():
        shared = np.zeros(len(perm), dtype=bool)
        shared[1:] |= same
        shared[:-1] |= same
        at = np.flatnonzero(shared)
        rows = perm[at]  # index order within each run of equal keys (stable)
        perm[at] = rows[np.lexsort((tie[rows], neg_dur[rows], packed[rows]))]
    return perm


def _last_before(sw: _Sweep, rows: np.ndarray, level: np.ndarray, strict: bool) -> np.ndarray | None:
    """For each sweep row in ``rows``: the sweep row of the last start before it (at or before when
    not ``strict``) in the same lane whose depth is ``level``; -1 when there is none. None when the
    combined key would overflow int64."""
    starts = np.flatnonzero(sw.order == _START)
    if len(starts) == 0:
        return np.full(len(rows), -1, dtype=np.int64)
    width = int(sw.depth.max(initial=0)) + 2
    span = len(sw.order) + 1
    if (int(sw.lane.max(initial=0)) + 1) * width * span >= 2**62:
        return None
    skey = (sw.lane[starts] * width + sw.depth[starts]) * span + starts
    sort = np.argsort(skey, kind="stable")
    skey = skey[sort]
    qkey = (sw.lane[rows] * width + level) * span + rows
    at = np.searchsorted(skey, qkey, side="left" if strict else "right") - 1
    found = at >= 0
    hit = np.where(found, starts[sort][np.maximum(at, 0)], -1)
    same = found & (sw.lane[np.maximum(hit, 0)] == sw.lane[rows]) & (sw.depth[np.maximum(hit, 0)] == level)
    return np.where(same & (level >= 0), hit, -1)


def _boundaries(intervals: pl.DataFrame, points: pl.DataFrame | None, lane: Sequence[str]) -> pl.LazyFrame:
    """Sorted boundary/query rows with the running depth per lane (lazy: callers collect once).

    A zero-length interval is one row (``_ZERO``, no depth change): it sits inside whatever is open
    at its time and contains nothing, which is what half-open containment says.
    """
    lane = list(lane)
    iv = intervals.lazy().select([*lane, "id", pl.col("ts_ns"), pl.col("end_ns")])
    zero = pl.col("end_ns") <= pl.col("ts_ns")
    starts = iv.select(
        *lane,
        pl.col("id"),
        pl.col("ts_ns").alias("t"),
        pl.when(zero).then(pl.lit(_ZERO)).otherwise(pl.lit(_START)).cast(pl.Int8).alias("order"),
        (pl.col("ts_ns") - pl.col("end_ns")).alias("neg_dur"),  # outermost first among equal starts
        pl.when(zero).then(pl.lit(0)).otherwise(pl.lit(1)).cast(pl.Int32).alias("delta"),
        pl.lit(None, dtype=pl.Int64).alias("qid"),
    )
    ends = iv.filter(~zero).select(
        *lane,
        pl.col("id"),
        pl.col("end_ns").alias("t"),
        pl.lit(_END, dtype=pl.Int8).alias("order"),
        pl.lit(0, dtype=pl.Int64).alias("neg_dur"),
        pl.lit(-1, dtype=pl.Int32).alias("delta"),
        pl.lit(None, dtype=pl.Int64).alias("qid"),
    )
    parts = [starts, ends]
    if points is not None:
        parts.append(
            points.lazy().select(
                *lane,
                pl.lit(None, dtype=intervals.schema["id"]).alias("id"),
                pl.col("t"),
                pl.lit(_QUERY, dtype=pl.Int8).alias("order"),
                pl.lit(0, dtype=pl.Int64).alias("neg_dur"),
                pl.lit(0, dtype=pl.Int32).alias("delta"),
                pl.col("qid"),
            )
        )
    rows = pl.concat(parts, how="vertical_relaxed").sort([*lane, "t", "order", "neg_dur"])
    return rows.with_columns(
        pl.int_range(0, pl.len(), dtype=pl.Int64).alias("pos"),
        pl.col("delta").cum_sum().over(lane).alias("depth"),
    )


def enclosing(
    intervals: pl.DataFrame,
    points: pl.DataFrame,
    *,
    lane: Sequence[str] = ("tid",),
    outermost: bool = False,
) -> pl.DataFrame:
    """For each point, the innermost (or outermost) interval of the same lane that contains it.

    Args:
        intervals: columns ``*lane``, ``id`` (an integer id, unique within its lane), ``ts_ns``,
            ``end_ns``; intervals of one lane are expected to nest (partial overlaps give NULL, never a wrong answer).
        points: columns ``*lane``, ``qid`` (int64 query id, unique), ``t`` (int64 ns).
        lane: columns that identify a thread (e.g. ``("pid", "tid")``); nesting is per lane.
        outermost: return the depth-1 enclosing interval instead of the innermost one.

    Returns:
        One row per point: ``qid``, ``id`` (NULL when nothing encloses it) and ``depth`` (number of
        intervals of the lane open at ``t``).
    """
    lane = list(lane)
    if points.height == 0:
        return pl.DataFrame(
            {"qid": [], "id": [], "depth": []},
            schema={"qid": pl.Int64, "id": intervals.schema.get("id", pl.Int64), "depth": pl.Int32},
        )
    if intervals.height == 0:  # nothing encloses anything (no sweep, no query plan)
        return pl.DataFrame(
            [
                points.get_column("qid"),
                pl.Series("id", [None] * points.height, dtype=intervals.schema.get("id", pl.Int64)),
                pl.Series("depth", np.zeros(points.height, dtype=np.int32), dtype=pl.Int32),
            ]
        )
    sw = _np_sweep(intervals, points, lane)
    if sw is not None:
        sel = np.flatnonzero(sw.order == _QUERY)
        depth = sw.depth[sel]
        last = _last_before(sw, sel, np.ones_like(depth) if outermost else depth, strict=False)
        if last is not None and intervals.height:
            iv = np.where(last >= 0, sw.src[np.maximum(last, 0)], 0)
            q = sw.src[sel]
            t = points.get_column("t").cast(pl.Int64).to_numpy()[q]
            ts = intervals.get_column("ts_ns").cast(pl.Int64).to_numpy()[iv]
            end = intervals.get_column("end_ns").cast(pl.Int64).to_numpy()[iv]
            # verify containment: a partial overlap upstream can make the depth bookkeeping lie
            ok = (last >= 0) & (depth > 0) & (ts <= t) & (t < end)
            ids = intervals.get_column("id").gather(pl.Series(iv, dtype=pl.Int64))
            return pl.DataFrame(
                [
                    points.get_column("qid").gather(pl.Series(q, dtype=pl.Int64)),
                    ids.set(pl.Series(~ok), None) if not ok.all() else ids,
                    pl.Series("depth", depth, dtype=pl.Int32),
                ]
            )
    rows = _boundaries(intervals, points, lane)
    starts = rows.filter(pl.col("order") == _START).select(*lane, "pos", pl.col("depth").alias("level"), "id")
    queries = rows.filter(pl.col("order") == _QUERY).select(*lane, "pos", "qid", "depth", "t")
    queries = queries.with_columns((pl.lit(1, dtype=pl.Int32) if outermost else pl.col("depth")).alias("level"))
    hit = queries.join_asof(starts, on="pos", by=[*lane, "level"], strategy="backward", check_sortedness=False)
    # verify containment: a partial overlap upstream can make the depth bookkeeping lie
    bounds = intervals.select(*lane, pl.col("id"), pl.col("ts_ns").alias("_ts"), pl.col("end_ns").alias("_end"))
    hit = hit.join(bounds.lazy(), on=[*lane, "id"], how="left")
    ok = (pl.col("depth") > 0) & (pl.col("_ts") <= pl.col("t")) & (pl.col("t") < pl.col("_end"))
    return hit.select("qid", pl.when(ok).then(pl.col("id")).alias("id"), "depth").collect(engine=ENGINE)


def covered(intervals: pl.DataFrame, points: pl.DataFrame, *, lane: Sequence[str] = ()) -> pl.DataFrame:
    """For each point, how many intervals of its lane contain it (they need not nest).

    Args:
        intervals: columns ``*lane``, ``id``, ``ts_ns``, ``end_ns``.
        points: columns ``*lane``, ``qid``, ``t``.
        lane: grouping columns; empty means all intervals count for all points.

    Returns:
        ``qid`` and ``count`` (int) for every point.
    """
    lane = list(lane)
    if points.height == 0:
        return pl.DataFrame({"qid": [], "count": []}, schema={"qid": pl.Int64, "count": pl.Int32})
    if not lane:
        intervals = intervals.with_columns(pl.lit(0, dtype=pl.Int8).alias("_lane"))
        points = points.with_columns(pl.lit(0, dtype=pl.Int8).alias("_lane"))
        lane = ["_lane"]
    sw = _np_sweep(intervals, points, lane)
    if sw is not None:
        sel = np.flatnonzero(sw.order == _QUERY)
        return pl.DataFrame(
            [
                points.get_column("qid").gather(pl.Series(sw.src[sel], dtype=pl.Int64)),
                pl.Series("count", sw.depth[sel], dtype=pl.Int32),
            ]
        )
    rows = _boundaries(intervals, points, lane)
    return rows.filter(pl.col("order") == _QUERY).select("qid", pl.col("depth").alias("count")).collect(engine=ENGINE)


def launch_points(frame: pl.DataFrame) -> pl.DataFrame:
    """Query points at the CPU launch of each row of ``frame`` that has one (``launch_ns`` and
    ``cpu_tid`` known): ``rank``, ``pid``, ``tid``, ``t`` the launch, ``qid`` the row's number in
    ``frame`` (an answer is put back by row, no join on ids).

    Series operations: a frame operation plans a query first, which costs more than the tens to
    thousands of rows it is asked for here."""
    launch, tid = frame.get_column("launch_ns"), frame.get_column("cpu_tid")
    launched = launch.is_not_null() & tid.is_not_null()
    return pl.DataFrame(
        [
            frame.get_column("rank").filter(launched),
            frame.get_column("cpu_pid").filter(launched).alias("pid"),
            tid.filter(launched).alias("tid"),
            launch.filter(launched).alias("t"),
            pl.Series("qid", np.flatnonzero(launched.to_numpy()), dtype=pl.Int64),
        ]
    )


def rows_of(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The row in ``ids`` (unique) of each of ``wanted`` (all present): e.g. the row of an interval
    ``enclosing`` answered with, to take its columns without a join."""
    order = np.argsort(ids, kind="stable")
    return order[np.searchsorted(ids, wanted, sorter=order)]


def parents(intervals: pl.DataFrame, *, lane: Sequence[str] = ("tid",)) -> pl.DataFrame:
    """The parent (innermost strictly enclosing interval) of every interval.

    Args:
        intervals: columns ``*lane``, ``id``, ``ts_ns``, ``end_ns``.

    Returns:
        ``id``, ``parent_id`` (NULL for roots and for partial overlaps) and ``depth`` (1 for roots).
    """
    lane = list(lane)
    if intervals.height == 0:
        return pl.DataFrame(
            {"id": [], "parent_id": [], "depth": []},
            schema={"id": intervals.schema.get("id", pl.Int64), "parent_id": pl.Int64, "depth": pl.Int32},
        )
    sw = _np_sweep(intervals, None, lane)
    if sw is not None:
        sel = np.flatnonzero(sw.order != _END)  # starts and zero-length intervals, in sweep order
        depth = sw.depth[sel] + (sw.order[sel] == _ZERO)
        last = _last_before(sw, sel, depth - 1, strict=True)
        if last is not None:
            own, par = sw.src[sel], np.where(last >= 0, sw.src[np.maximum(last, 0)], 0)
            ts = intervals.get_column("ts_ns").cast(pl.Int64).to_numpy()
            end = intervals.get_column("end_ns").cast(pl.Int64).to_numpy()
            ok = (last >= 0) & (ts[par] <= ts[own]) & (end[own] <= end[par]) & (ts[own] < end[par])
            ids = intervals.get_column("id")
            parent = ids.gather(pl.Series(par, dtype=pl.Int64)).alias("parent_id")
            return pl.DataFrame(
                [
                    ids.gather(pl.Series(own, dtype=pl.Int64)),
                    parent.set(pl.Series(~ok), None) if not ok.all() else parent,
                    pl.Series("depth", depth, dtype=pl.Int32),
                ]
            )
    rows = _boundaries(intervals, None, lane)
    starts = rows.filter(pl.col("order") == _START).select(*lane, "pos", "id", "depth")
    right = starts.select(*lane, "pos", pl.col("depth").alias("level"), pl.col("id").alias("parent_id"))
    zeros = rows.filter(pl.col("order") == _ZERO).select(*lane, "pos", "id", (pl.col("depth") + 1).alias("depth"))
    left = pl.concat([starts, zeros]).with_columns((pl.col("depth") - 1).alias("level")).sort("pos")
    hit = left.join_asof(
        right, on="pos", by=[*lane, "level"], strategy="backward", allow_exact_matches=False, check_sortedness=False
    )
    b = intervals.lazy().select(*lane, "id", "ts_ns", "end_ns")
    hit = hit.join(b, on=[*lane, "id"], how="left").join(
        b.select(
            *lane, pl.col("id").alias("parent_id"), pl.col("ts_ns").alias("_pts"), pl.col("end_ns").alias("_pend")
        ),
        on=[*lane, "parent_id"],
        how="left",
    )
    ok = (
        (pl.col("_pts") <= pl.col("ts_ns"))
        & (pl.col("end_ns") <= pl.col("_pend"))
        & (pl.col("ts_ns") < pl.col("_pend"))
    )
    return hit.select("id", pl.when(ok).then(pl.col("parent_id")).alias("parent_id"), "depth").collect(engine=ENGINE)


class NameIndex:
    """The distinct event names of a batch, so each name regex runs once per distinct name.

    Traces repeat a few thousand names (some of them kilobyte-long kernel signatures) millions of
    times: matching the distinct names once and testing membership is much cheaper than running a
    regex, or even a hash, over every row for every pattern. ``patterns`` known up front are matched
    together in one frame operation on first use (each operation has a fixed cost that dominates on
    small traces); ``later`` ones together when one of them is first asked for (patterns only some
    batches need: a batch that never asks does not compile or run them); others one at a time.

    On the rows of the indexed frame itself (``names_like`` with that frame) the answer is a mask
    column: each row's name is coded once as its place among the distinct names (an enum cast),
    and a pattern's mask is a lookup of its flags per distinct name, where an ``is_in`` in a plan
    has a fixed cost per use. The mask has the frame's rows: it stands in a plan over
    the frame before any filter.
    """

    def __init__(self, frame: pl.DataFrame, patterns: Sequence[str] = (), later: Sequence[str] = ()) -> None:
        self._frame = frame
        names = frame.get_column("name").unique()
        self._names = names.drop_nulls() if names.null_count() else names  # a NULL name matches nothing
        self._flags: dict[str, np.ndarray] = {}  # per pattern, which of ``_names`` match
        self._matches: dict[str, pl.Series] = {}
        self._masks: dict[str, pl.Series] = {}
        self._codes: tuple[np.ndarray, pl.Series | None] | None = None
        self._pending = list(dict.fromkeys(patterns))
        self._later = [p for p in dict.fromkeys(later) if p not in self._pending]

    def indexes(self, frame: pl.DataFrame) -> bool:
        """``frame`` is the indexed frame (its rows are the masks' rows)."""
        return frame is self._frame

    def _match(self, patterns: list[str]) -> None:
        flags = self._names.to_frame("name").select(
            pl.col("name").str.contains(p).alias(f"_{i}") for i, p in enumerate(patterns)
        )
        for i, p in enumerate(patterns):
            matched = flags.get_column(f"_{i}")
            self._flags[p] = matched.to_numpy()
            self._matches[p] = self._names.filter(matched)

    def _hits(self, pattern: str) -> pl.Series:
        """The batch's names that match ``pattern``."""
        if pattern not in self._matches:
            if pattern in self._later:
                self._match([pattern, *(p for p in self._later if p != pattern and p not in self._matches)])
                self._later = []
            else:
                self._match([pattern, *(p for p in self._pending if p != pattern and p not in self._matches)])
                self._pending = []
        return self._matches[pattern]

    def any_like(self, pattern: str) -> bool:
        """Some name of the batch matches ``pattern`` (else a sweep over its ranges can be skipped)."""
        return self._hits(pattern).len() > 0

    def like(self, pattern: str, column: str = "name") -> pl.Expr:
        """``pl.col(column).str.contains(pattern)`` for a column whose values are names of this batch
        (``name``, or an operator's ``cpu_op_name``); NULL stays NULL."""
        # imploded inside the expression (``is_in`` wants a list): cheaper per match than a Python
        # list of the hits and a Series built from it
        return pl.col(column).is_in(pl.lit(self._hits(pattern)).implode())

    def rows_like(self, pattern: str) -> pl.Expr:
        """``like(pattern)`` as the indexed frame's mask column (NULL where the name is NULL)."""
        if pattern not in self._masks:
            if self._codes is None:  # each row's name as its place in ``_names`` (NULL: 0, masked below)
                name = self._frame.get_column("name")
                place = name.cast(pl.Enum(self._names)).to_physical().cast(pl.Int64)
                nulls = name.is_null() if name.null_count() else None
                self._codes = ((place.fill_null(0) if nulls is not None else place).to_numpy(), nulls)
            rows, nulls = self._codes
            self._hits(pattern)
            flags = self._flags[pattern]
            mask = pl.Series(flags[rows] if len(flags) else np.zeros(len(rows), dtype=bool))
            self._masks[pattern] = mask if nulls is None else mask.set(nulls, None)
        return pl.lit(self._masks[pattern])


def names_like(frame: pl.DataFrame, pattern: str, names: NameIndex | None = None) -> pl.Expr:
    """``pl.col("name").str.contains(pattern)`` via ``names`` (or the distinct names of ``frame``):
    a mask column when ``names`` indexes ``frame`` itself (the expression then belongs in a plan
    over ``frame``'s rows, before any filter), else a membership test of the column."""
    if names is not None and names.indexes(frame):
        return names.rows_like(pattern)
    return (names or NameIndex(frame)).like(pattern)

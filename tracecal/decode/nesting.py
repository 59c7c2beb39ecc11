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

import polars as pl

_END, _START, _ZERO, _QUERY = 0, 1, 2, 3


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
    rows = _boundaries(intervals, points, lane)
    starts = rows.filter(pl.col("order") == _START).select(*lane, "pos", pl.col("depth").alias("level"), "id")
    queries = rows.filter(pl.col("order") == _QUERY).select(*lane, "pos", "qid", "depth", "t")
    queries = queries.with_columns((pl.lit(1, dtype=pl.Int32) if outermost else pl.col("depth")).alias("level"))
    hit = queries.join_asof(starts, on="pos", by=[*lane, "level"], strategy="backward", check_sortedness=False)
    # verify containment: a partial overlap upstream can make the depth bookkeeping lie
    bounds = intervals.select(*lane, pl.col("id"), pl.col("ts_ns").alias("_ts"), pl.col("end_ns").alias("_end"))
    hit = hit.join(bounds.lazy(), on=[*lane, "id"], how="left")
    ok = (pl.col("depth") > 0) & (pl.col("_ts") <= pl.col("t")) & (pl.col("t") < pl.col("_end"))
    return hit.select("qid", pl.when(ok).then(pl.col("id")).alias("id"), "depth").collect()


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
    rows = _boundaries(intervals, points, lane)
    return rows.filter(pl.col("order") == _QUERY).select("qid", pl.col("depth").alias("count")).collect()


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
    return hit.select("id", pl.when(ok).then(pl.col("parent_id")).alias("parent_id"), "depth").collect()


class NameIndex:
    """The distinct event names of a batch, so each name regex runs once per distinct name.

    Traces repeat a few thousand names (some of them kilobyte-long kernel signatures) millions of
    times: matching the distinct names once and testing membership is much cheaper than running a
    regex, or even a hash, over every row for every pattern.
    """

    def __init__(self, frame: pl.DataFrame) -> None:
        self._names = frame.get_column("name").unique()
        self._matches: dict[str, pl.Series] = {}

    def like(self, pattern: str) -> pl.Expr:
        """``pl.col("name").str.contains(pattern)`` for frames whose names come from this batch."""
        if pattern not in self._matches:
            self._matches[pattern] = self._names.filter(self._names.str.contains(pattern))
        return pl.col("name").is_in(self._matches[pattern].implode())


def names_like(frame: pl.DataFrame, pattern: str, names: NameIndex | None = None) -> pl.Expr:
    """``pl.col("name").str.contains(pattern)`` via ``names`` (or the distinct names of ``frame``)."""
    return (names or NameIndex(frame)).like(pattern)

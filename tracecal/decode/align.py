"""Cross-rank steps on the small per-run frames: match collectives, align clocks, best iteration (pure).

Matching (docs/decode.md#matching): the same collective instance on every member rank gets one ``match_id``; by the
trace's sequence number / comms id when present, else by order of appearance within the process
group on each rank. Send/recv pair by (group, sender, receiver, order). An instance is matched only
when at least two ranks recorded it and they agree on the collective's name.

Clock alignment (docs/decode.md#clock-alignment): collective ends are near-simultaneous on all
members, so each rank's offset is the median over its matched instances of (instance centre − own
end), iterated so that ranks linked only through chains of groups converge; offsets are then shifted
so the lowest rank has 0. The residual is the median absolute difference between a rank's aligned
ends and the instance centres.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracecal.decode.frames import coalesce, with_series
from tracecal.decode.nesting import ENGINE


def match_collectives(collectives: pl.DataFrame) -> pl.DataFrame:
    """``collectives`` (all ranks of a run) with ``match_id`` filled.

    Args:
        collectives: rows from ``rank_collectives`` for every rank (``rank``, ``name``, ``group_key``,
            ``seq_in_group``, ``coll_seq``, ``peer``).

    Returns:
        The same rows with ``match_id`` (int64; NULL when unmatched), deterministic for a given input.
    """
    # one lazy plan: six eager frame operations would each pay a plan's fixed cost on a few hundred rows
    c = collectives.lazy().with_row_index("_row")
    p2p = pl.col("name").is_in(["send", "recv"]) & pl.col("peer").is_not_null()
    sender = pl.when(pl.col("name") == "send").then(pl.col("rank")).otherwise(pl.col("peer"))
    receiver = pl.when(pl.col("name") == "send").then(pl.col("peer")).otherwise(pl.col("rank"))
    c = c.with_columns(sender.alias("_snd"), receiver.alias("_rcv"))
    c = c.with_columns(
        pl.when(p2p)
        .then(pl.int_range(0, pl.len(), dtype=pl.Int64).over("rank", "group_key", "name", "peer", order_by="ts_ns"))
        .alias("_p2p_seq")
    )
    key = (
        pl.when(p2p)
        .then(
            pl.concat_str(
                [pl.lit("p"), pl.col("group_key"), pl.col("_snd"), pl.col("_rcv"), pl.col("_p2p_seq")], separator="|"
            )
        )
        .when(pl.col("coll_seq").is_not_null())
        .then(pl.concat_str([pl.lit("s"), pl.col("group_key"), pl.col("coll_seq")], separator="|"))
        .when(pl.col("seq_in_group").is_not_null())
        .then(pl.concat_str([pl.lit("o"), pl.col("group_key"), pl.col("seq_in_group")], separator="|"))
    )
    c = c.with_columns(key.alias("_key"))
    groups = (
        c.filter(pl.col("_key").is_not_null())
        .group_by("_key")
        .agg(
            pl.col("rank").n_unique().alias("_ranks"),
            pl.len().alias("_rows"),
            # a send and its recv are one instance: compare names with p2p folded together
            pl.col("name").replace({"send": "p2p", "recv": "p2p"}).n_unique().alias("_names"),
            pl.col("ts_ns").min().alias("_first"),
            pl.col("size_bytes").n_unique().alias("_sizes"),
            pl.col("name").first().alias("_name"),
        )
    )
    # members must agree on the collective and, except all-to-all (uneven splits), on its size:
    # order matching in a capture that lost events (sampled traces) must not pair different instances
    sizes_ok = (pl.col("_sizes") == 1) | (pl.col("_name") == "all_to_all")
    good = groups.filter(
        (pl.col("_ranks") >= 2) & (pl.col("_rows") == pl.col("_ranks")) & (pl.col("_names") == 1) & sizes_ok
    )
    good = good.sort("_first", "_key").with_row_index("match_id").select(pl.col("match_id").cast(pl.Int64), "_key")
    out = c.join(good, on="_key", how="left").sort("_row")
    again = ["match_id_right"] if "match_id" in collectives.columns else []  # matched before: kept as it was
    return out.drop("_row", "_snd", "_rcv", "_p2p_seq", "_key", *again).collect(engine=ENGINE)


def clock_offsets(collectives: pl.DataFrame, ranks: list[int], iterations: int = 3) -> pl.DataFrame:
    """Per-rank clock offset and residual from matched collective ends.

    Args:
        collectives: matched rows (``rank``, ``match_id``, ``end_ns``).
        ranks: every rank of the run.
        iterations: refinement rounds (centres recomputed from aligned ends).

    Returns:
        ``rank``, ``clock_offset_ns`` (add to the rank's timestamps; 0 for the lowest rank; NULL for
        a rank with no matched collective in a multi-rank run), ``clock_residual_ns``. A single-rank
        run has offset 0 and NULL residual.
    """
    schema = {"rank": pl.Int32, "clock_offset_ns": pl.Int64, "clock_residual_ns": pl.Int64}
    if len(ranks) <= 1:
        return pl.DataFrame(
            {"rank": ranks, "clock_offset_ns": [0] * len(ranks), "clock_residual_ns": [None] * len(ranks)},
            schema=schema,
        )
    # series and numpy from here: each frame operation plans a query first, a fixed cost that dominates on a few rows
    matched = collectives.get_column("match_id").is_not_null()
    m = pl.DataFrame([collectives.get_column(c).filter(matched) for c in ("rank", "match_id", "end_ns")])
    if m.height == 0:
        unknown = [None] * len(ranks)
        return pl.DataFrame({"rank": ranks, "clock_offset_ns": unknown, "clock_residual_ns": unknown}, schema=schema)
    # the refinement in numpy: a dozen small frame operations per round cost more than the arithmetic
    rank_ids = np.asarray(sorted(set(ranks)), dtype=np.int64)
    row_rank = np.searchsorted(rank_ids, m.get_column("rank").cast(pl.Int64).to_numpy())
    match = m.get_column("match_id").cast(pl.Int64).to_numpy()
    ends = m.get_column("end_ns").cast(pl.Int64).to_numpy()
    # relative to the earliest end: absolute ns (~1.7e18) are beyond float64's exact integers
    end = (ends - ends.min()).astype(np.float64)
    off = np.zeros(len(rank_ids))
    for _ in range(iterations):
        aligned = end + off[row_rank]
        centre = _group_median(match, aligned)
        off = off + np.nan_to_num(_per_group_median(row_rank, centre - aligned, len(rank_ids)))
    seen = np.unique(row_rank)
    off = off - off[seen[0]]
    aligned = end + off[row_rank]
    resid = _per_group_median(row_rank, np.abs(aligned - _group_median(match, aligned)), len(rank_ids))
    is_seen = np.zeros(len(rank_ids), dtype=bool)
    is_seen[seen] = True
    # rounded half to even, as polars' ``round``
    offsets = [int(o) if s else None for o, s in zip(np.round(off).tolist(), is_seen.tolist(), strict=True)]
    residuals = [None if np.isnan(r) else int(r) for r in np.round(resid).tolist()]
    return pl.DataFrame({"rank": rank_ids, "clock_offset_ns": offsets, "clock_residual_ns": residuals}, schema=schema)


def _group_median(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per row, the median of ``values`` over the rows sharing its key (even counts: the mean of the
    two middle values, as polars' ``median``)."""
    order = np.lexsort((values, keys))
    k, v = keys[order], values[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    sizes = np.diff(np.r_[starts, len(k)])
    lo, hi = v[starts + (sizes - 1) // 2], v[starts + sizes // 2]
    med = lo + (hi - lo) * 0.5
    out = np.empty(len(values))
    out[order] = np.repeat(med, sizes)
    return out


def _per_group_median(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Median of ``values`` per group number 0..n-1 (NaN for a group without rows)."""
    out = np.full(n, np.nan)
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    sizes = np.diff(np.r_[starts, len(g)])
    lo, hi = v[starts + (sizes - 1) // 2], v[starts + sizes // 2]
    out[g[starts]] = lo + (hi - lo) * 0.5
    return out


def apply_offsets(
    iterations: pl.DataFrame, collectives: pl.DataFrame, offsets: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Fill ``aligned_*`` columns of iterations and collectives (unknown offset counts as 0).

    Every rank of ``iterations`` and ``collectives`` has a row in ``offsets`` (a rank without one
    gets NULL aligned times). The offsets map ranks to shifts (a run has a few ranks): series
    operations, no query plan (whose fixed cost outweighs the work).
    """
    shifts = {
        rank: offset or 0
        for rank, offset in zip(offsets["rank"].to_list(), offsets["clock_offset_ns"].to_list(), strict=True)
    }

    def shift_of(frame: pl.DataFrame) -> pl.Series:
        return pl.Series([shifts.get(rank) for rank in frame.get_column("rank").to_list()], dtype=pl.Int64)

    off = shift_of(iterations)
    it = with_series(
        iterations,
        (coalesce(iterations["gpu_start_ns"], iterations["cpu_start_ns"]) + off).alias("aligned_start_ns"),
        (coalesce(iterations["gpu_end_ns"], iterations["cpu_end_ns"]) + off).alias("aligned_end_ns"),
    )
    co = with_series(collectives, (collectives.get_column("ts_ns") + shift_of(collectives)).alias("aligned_ts_ns"))
    return it, co


def best_iteration(iterations: pl.DataFrame) -> pl.DataFrame:
    """The run's best iteration: min over iterations of the slowest rank's span (docs/decode.md#iterations).

    Only iterations recorded on every rank compete (when there is at least one such iteration).
    A run has a few to a few hundred iteration rows: grouped in Python, cheaper than a group-by
    plan's fixed cost.

    Returns:
        One row: iteration, dur_ns (the slowest rank's span), slowest_rank, ranks; empty if no iterations.
        A NULL span sorts first, as polars sorts NULLs (both for the best and for the slowest rank).
    """
    schema = {"iteration": pl.Int32, "dur_ns": pl.Int64, "slowest_rank": pl.Int32, "ranks": pl.UInt32}
    if iterations.height == 0:
        return pl.DataFrame(schema=schema)
    rows = zip(*(iterations.get_column(c).to_list() for c in ("iteration", "rank", "dur_ns")), strict=True)
    groups: dict[int | None, list[tuple[int, int | None]]] = {}
    for iteration, rank, dur in rows:
        groups.setdefault(iteration, []).append((rank, dur))
    n = len({rank for members in groups.values() for rank, _ in members})
    per = []
    for iteration, members in groups.items():
        durs = [dur for _, dur in members if dur is not None]
        # the first member with the longest span (a NULL span first, as a descending sort puts it)
        longest = max(durs) if durs else None
        slowest = next(rank for rank, dur in members if dur is None or (longest is not None and dur == longest))
        per.append((iteration, longest, slowest, len({rank for rank, _ in members})))
    full = [row for row in per if row[3] == n]
    best = min(full or per, key=lambda row: (row[1] is not None, row[1] or 0, row[0] is not None, row[0] or 0))
    return pl.DataFrame([best], schema=schema, orient="row")

"""Iteration windows and spans per rank, pure (rules: docs/decode.md#iterations).

An iteration is a CPU window: ``ProfilerStep#N`` (default) or the ranges whose names match a
``--iteration-marker`` regex. GPU work belongs to the iteration whose CPU window *launched* it (the
runtime call's start), not to the window it happens to run in. A rank without markers is one
iteration (index 0, ``marker`` NULL) spanning all its CPU activity.

Every frame here may hold several ranks (a ``rank`` column); windows never cross ranks.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection

import numpy as np
import polars as pl

from tracecal.decode.frames import sort_by
from tracecal.decode.nesting import ENGINE, NameIndex, names_like
from tracecal.errors import TraceFormatError

DEFAULT_MARKER = r"^ProfilerStep#(\d+)$"
MARKER_KINDS = ("user_annotation", "cpu_op", "python_function", "nvtx")
"""Event kinds whose ranges can be iteration markers."""
_CPU_KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "nvtx")
_WINDOW_SCHEMA = {
    "rank": pl.Int32,
    "iteration": pl.Int32,
    "marker": pl.Utf8,
    "cpu_start_ns": pl.Int64,
    "cpu_end_ns": pl.Int64,
}


def _number(names: list[str], compiled: re.Pattern[str]) -> list[int]:
    """Iteration indices of one rank's markers: the captured / trailing ``#N`` number, else their order."""
    numbers: list[int | None] = []
    for name in names:
        m = compiled.search(name)
        if m and m.groups() and m.group(1) and m.group(1).isdigit():
            numbers.append(int(m.group(1)))
        else:
            tail = re.search(r"#(\d+)$", name)
            numbers.append(int(tail.group(1)) if tail else None)
    if any(n is None for n in numbers) or len(set(numbers)) != len(numbers):
        return list(range(len(names)))
    return [n for n in numbers if n is not None]


def _outermost(cands: pl.DataFrame) -> pl.DataFrame:
    """Marker candidates sorted by rank, start, event id, without the nested or repeated ones (a
    framework marker inside a python frame of the same name): a window is kept unless an earlier
    candidate of its rank ends after it starts. A few rows per iteration: a Python pass over numpy
    arrays (the frame plan of a sort and a running maximum per rank costs more)."""
    ts, end = cands.get_column("ts_ns"), cands.get_column("end_ns")
    if ts.null_count() or end.null_count():  # unknown times: the frame plan, which orders NULLs first
        return (
            cands.sort("rank", "ts_ns", "event_id")
            .with_columns(pl.col("end_ns").cum_max().shift(1).over("rank").alias("_prev_end"))
            .filter(pl.col("_prev_end").is_null() | (pl.col("ts_ns") >= pl.col("_prev_end")))
            .drop("_prev_end")
        )
    rank = cands.get_column("rank").cast(pl.Int64).to_numpy()
    start, stop = ts.cast(pl.Int64).to_numpy(), end.cast(pl.Int64).to_numpy()
    order = np.lexsort((cands.get_column("event_id").cast(pl.Int64).to_numpy(), start, rank)).tolist()
    rank_l, start_l, stop_l = rank.tolist(), start.tolist(), stop.tolist()
    keep: list[int] = []
    current, reach = None, 0
    for i in order:
        if rank_l[i] != current:
            current, reach = rank_l[i], stop_l[i]
            keep.append(i)
            continue
        if start_l[i] >= reach:
            keep.append(i)
        reach = max(reach, stop_l[i])
    return cands[keep]


def iteration_windows(events: pl.DataFrame, marker: str | None = None, names: NameIndex | None = None) -> pl.DataFrame:
    """The iteration windows of every rank in ``events``.

    Args:
        events: events (``schema.EVENTS`` columns plus ``end_ns``) of one or more ranks.
        marker: regex for iteration ranges; None means ``ProfilerStep#N``. When the regex has a
            numeric capture group (or the name ends in ``#N``) that number is the iteration index,
            otherwise windows are numbered 0, 1, ... in time order.

    Returns:
        Columns rank, iteration (int32), marker, cpu_start_ns, cpu_end_ns; one row per window. A rank
        without markers gets one row (iteration 0, marker NULL) over its CPU events (all its events
        when it has no CPU events).

    Raises:
        TraceFormatError: ``marker`` is not a valid regular expression.
    """
    pattern = marker or DEFAULT_MARKER
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise TraceFormatError(f"--iteration-marker {pattern!r} is not a valid regex: {exc}") from exc
    like = names_like(events, pattern, names)
    # one lazy plan (each eager frame operation has a fixed cost): the marker candidates, and the
    # ranks and the first rank of the batch, to tell whether some rank has no marker at all
    lazy = events.lazy().select("rank", "event_id", "kind", "name", "ts_ns", "end_ns")
    cands_lazy = lazy.filter(pl.col("kind").is_in(MARKER_KINDS) & like)
    ranks_lazy = lazy.select(pl.col("rank").unique())
    cands, all_ranks = pl.collect_all([cands_lazy, ranks_lazy], engine=ENGINE)
    cands = _outermost(cands)
    parts = []
    if cands.height:
        # numbered per rank (rows are sorted by rank), one frame for all ranks
        rank_of, names_of = cands.get_column("rank").to_list(), cands.get_column("name").to_list()
        numbers: list[int] = []
        start = 0
        for end in range(1, len(rank_of) + 1):
            if end == len(rank_of) or rank_of[end] != rank_of[start]:
                numbers.extend(_number(names_of[start:end], compiled))
                start = end
        parts.append(
            pl.DataFrame(
                {
                    "rank": cands.get_column("rank"),
                    "iteration": numbers,
                    "marker": cands.get_column("name"),
                    "cpu_start_ns": cands.get_column("ts_ns"),
                    "cpu_end_ns": cands.get_column("end_ns"),
                },
                schema=_WINDOW_SCHEMA,
            )
        )
    marked = set(cands.get_column("rank").to_list())
    if not set(all_ranks["rank"].to_list()) <= marked:
        rest = events.select("rank", "kind", "ts_ns", "end_ns").filter(~pl.col("rank").is_in(list(marked)))
        cpu = rest.filter(pl.col("kind").is_in(_CPU_KINDS))
        # ranks without CPU events fall back to all their events
        span = pl.concat([cpu, rest.filter(~pl.col("rank").is_in(cpu["rank"].unique().implode()))])
        parts.append(
            span.group_by("rank")
            .agg(pl.col("ts_ns").min().alias("cpu_start_ns"), pl.col("end_ns").max().alias("cpu_end_ns"))
            .select(
                pl.col("rank").cast(pl.Int32),
                pl.lit(0, dtype=pl.Int32).alias("iteration"),
                pl.lit(None, dtype=pl.Utf8).alias("marker"),
                "cpu_start_ns",
                "cpu_end_ns",
            )
        )
    if not parts:
        return pl.DataFrame(schema=_WINDOW_SCHEMA)
    return sort_by(parts[0] if len(parts) == 1 else pl.concat(parts, how="vertical_relaxed"), "rank", "cpu_start_ns")


def window_of(rank: pl.Series, t: pl.Series, windows: pl.DataFrame) -> pl.Series:
    """Per point (``rank``, ``t``): the iteration whose window on that rank contains ``t`` (half-open
    ``[cpu_start_ns, cpu_end_ns)``), as an int32 Series named ``iteration``; NULL outside every window
    and where ``t`` is NULL.

    Windows of a rank do not overlap (``iteration_windows`` drops nested ones), so the window holding
    a point is the last one of its rank starting at or before it: a binary search per rank in numpy
    (a few frame operations cost more than the search on the few thousand points of most traces).
    Zero-length windows contain nothing.
    """
    n = len(rank)
    out = np.full(n, -1, dtype=np.int64)
    found = np.zeros(n, dtype=bool)
    start, end = windows.get_column("cpu_start_ns"), windows.get_column("cpu_end_ns")
    w_start, w_end = _int64(start), _int64(end)
    w_rank = windows.get_column("rank").cast(pl.Int64).to_numpy()
    keep = (start.is_not_null() & end.is_not_null()).to_numpy() & (w_end > w_start)
    w_order = np.lexsort((w_start, w_rank))
    w_order = w_order[keep[w_order]]  # by rank, then start
    if n and len(w_order):
        w_rank, w_start, w_end = w_rank[w_order], w_start[w_order], w_end[w_order]
        w_it = windows.get_column("iteration").cast(pl.Int64).to_numpy()[w_order]
        p_rank = rank.cast(pl.Int64).fill_null(-1).to_numpy()
        p_null = t.is_null().to_numpy()
        p_t = _int64(t)
        order = np.argsort(p_rank, kind="stable")
        sorted_rank = p_rank[order]
        bounds = np.flatnonzero(np.r_[True, w_rank[1:] != w_rank[:-1], True])
        for a, b in itertools.pairwise(bounds):
            lo, hi = np.searchsorted(sorted_rank, [w_rank[a], w_rank[a] + 1])
            idx = order[lo:hi]
            tt = p_t[idx]
            j = np.searchsorted(w_start[a:b], tt, side="right") - 1
            jj = np.maximum(j, 0) + a
            ok = (j >= 0) & (tt < w_end[jj]) & ~p_null[idx]
            out[idx[ok]] = w_it[jj[ok]]
            found[idx[ok]] = True
    iteration = pl.Series("iteration", out, dtype=pl.Int32)
    return iteration if found.all() else iteration.set(pl.Series(~found), None)


def _int64(values: pl.Series) -> np.ndarray:
    """An integer series as int64 numpy, NULL as 0 (``fill_null`` is a frame operation: only when needed)."""
    values = values.cast(pl.Int64)
    return (values.fill_null(0) if values.null_count() else values).to_numpy()


def iteration_spans(windows: pl.DataFrame, operators: pl.DataFrame, *, gpu_ranks: Collection[int]) -> pl.DataFrame:
    """Per-iteration CPU and GPU spans of each rank (``schema.ITERATIONS`` minus run_id/aligned).

    The GPU span of a (rank, iteration) is the first start and last end of its operators: grouped in
    numpy by one packed key and looked up per window (the few windows of a batch), because a
    group-by joined to the windows costs more in fixed plan cost than the work itself.

    Args:
        windows: ``iteration_windows`` output.
        operators: operators with ``rank``, ``iteration``, ``ts_ns``, ``dur_ns``.
        gpu_ranks: ranks with GPU activity (their ``dur_ns`` is the GPU span, else the CPU span).

    Returns:
        rank, iteration, marker, cpu_start_ns, cpu_end_ns, gpu_start_ns, gpu_end_ns, dur_ns.
    """
    ts = operators.get_column("ts_ns")
    rank = _int64(operators.get_column("rank"))
    # operators without an iteration or a start are in no span (a min / max skips NULLs)
    counted = (operators.get_column("iteration").is_not_null() & ts.is_not_null()).to_numpy()
    counted &= np.isin(rank, list(gpu_ranks))
    key = _span_key(rank, _int64(operators.get_column("iteration")))[counted]
    order = np.argsort(key, kind="stable")
    key, start = key[order], _int64(ts)[counted][order]
    end = start + _int64(operators.get_column("dur_ns"))[counted][order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, dtype=np.int64)
    groups = key[first]
    w_key = _span_key(_int64(windows.get_column("rank")), _int64(windows.get_column("iteration")))
    at = np.searchsorted(groups, w_key)
    found = at < len(groups)
    found[found] = groups[at[found]] == w_key[found]
    gpu_start_ns, gpu_end_ns = np.zeros(len(w_key), dtype=np.int64), np.zeros(len(w_key), dtype=np.int64)
    if found.any():
        gpu_start_ns[found] = np.minimum.reduceat(start, first)[at[found]]
        gpu_end_ns[found] = np.maximum.reduceat(end, first)[at[found]]
    has_gpu = pl.Series(found)
    gpu_start, gpu_end = pl.Series("gpu_start_ns", gpu_start_ns), pl.Series("gpu_end_ns", gpu_end_ns)
    if not found.all():
        gpu_start, gpu_end = gpu_start.set(~has_gpu, None), gpu_end.set(~has_gpu, None)
    cpu_dur = windows.get_column("cpu_end_ns") - windows.get_column("cpu_start_ns")
    dur = (gpu_end - gpu_start).zip_with(has_gpu, cpu_dur).alias("dur_ns")
    return sort_by(windows.hstack([gpu_start, gpu_end, dur]), "rank", "cpu_start_ns")


def _span_key(rank: np.ndarray, iteration: np.ndarray) -> np.ndarray:
    """(rank, iteration) as one int64: the rank in the high 32 bits, the int32 iteration's bits below."""
    return (rank << 32) | (iteration & 0xFFFFFFFF)

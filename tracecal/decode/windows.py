"""Decode windows: a large rank decoded a few iterations at a time, with the same rows (pure).

Rules (docs/decode.md#windows): a decode window is a run of consecutive iterations of one rank and
covers the CPU time from the start of its first iteration to the start of the next window's (the
first window from the beginning of the capture, the last to its end). Every per-iteration rule then
sees all of an iteration's work, and CPU intervals that cross a window's start are added to it as
context. The pipeline (``tracecal.pipeline.decode``) reads each window's events; this module says
how iterations are grouped, what a window must know of the rest of its rank (``RankWindow``), and
how the windows' collectives are numbered as the whole rank's would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl


@dataclass(frozen=True)
class RankWindow:
    """What decoding one window of a rank needs to know of the rest of the rank.

    Attributes:
        iterations: the rank's ``iteration_windows`` rows that this window holds.
        gpu: the rank has GPU activity (a window without any stays a GPU rank, whose operators are
            GPU activities, not CPU leaf operators).
        context_ids: event ids of the context rows (intervals that started in an earlier window):
            no output row is one of them, they are output by the window they start in.
        not_leaves: event ids of CPU operators of this window that enclose a CPU operator of a later
            window (CPU-only ranks): no leaf, though nothing in this window is nested in them.
    """

    iterations: pl.DataFrame
    gpu: bool
    context_ids: np.ndarray
    not_leaves: np.ndarray


def window_firsts(starts: Sequence[int], events: Sequence[int], budget: int) -> list[int]:
    """Positions of the iterations that begin a decode window: consecutive iterations whose events
    add up to at most ``budget`` share one (an iteration larger than that is a window of its own).

    Args:
        starts: the iterations' CPU starts, ascending.
        events: events per iteration (``starts``' order).
        budget: most events per window.

    A window begins only where the start grows: iterations starting together stay together.
    """
    firsts: list[int] = []
    total = 0
    for position, n in enumerate(events):
        if not firsts or (total + n > budget and starts[position] > starts[position - 1]):
            firsts.append(position)
            total = 0
        total += n
    return firsts


def events_per_iteration(starts: Sequence[int], ts_ns: np.ndarray, missing: np.ndarray | None = None) -> np.ndarray:
    """How many of the events starting at ``ts_ns`` each iteration holds: an event counts for the last
    iteration starting at or before it, the first iteration when none does or when its time is
    ``missing`` (mask, or None).

    Args:
        starts: the iterations' CPU starts, ascending.
        ts_ns: some events' starts (any order; its values where ``missing`` are ignored).
    """
    position = np.searchsorted(np.asarray(starts, dtype=np.int64), ts_ns, side="right") - 1
    np.maximum(position, 0, out=position)
    if missing is not None:
        position[missing] = 0
    return np.bincount(position, minlength=len(starts))


def crossing_windows(
    event_ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, bounds: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The intervals ``[starts, ends)`` that cross a window start, and the windows they are context for.

    Window 0 starts before everything and window ``w`` (1-based) at ``bounds[w - 1]`` (ascending). An
    interval is context for window ``w`` when ``start < bounds[w - 1] < end``: for the windows after the
    one it starts in, up to the one holding its end.

    Returns:
        ``(event_ids, first_window, last_window)`` of the intervals that cross at least one start.
    """
    edges = np.asarray(bounds, dtype=np.int64)
    first = np.searchsorted(edges, starts, side="right") + 1
    last = np.searchsorted(edges, ends, side="left")
    crossing = last >= first
    return event_ids[crossing], first[crossing], last[crossing]


def number_in_group(windows: Sequence[pl.DataFrame], *, gpu: bool) -> pl.DataFrame:
    """One rank's collectives from its windows (in time order), ``seq_in_group`` numbered as
    ``collectives.rank_collectives`` numbers the whole rank's.

    Within a group (and linked or not), instances are numbered in call order: a GPU rank's by the
    kernel's start, so here by ``ts_ns`` as there; a CPU-only rank's by the launch of the gloo call,
    which is not a column of the rows, so by window and then by the window's own number (the calls of
    an earlier window come first). Unlinked instances (launched before the capture) are numbered only
    when the rank has no linked one.
    """
    parts = [w.with_columns(pl.lit(i, dtype=pl.Int32).alias("_window")) for i, w in enumerate(windows) if w.height]
    if not parts:
        return windows[0] if windows else pl.DataFrame()
    colls = pl.concat(parts, how="vertical_relaxed")
    order = ["ts_ns", "event_id"] if gpu else ["_window", "seq_in_group", "event_id"]
    numbered = pl.col("linked") | ~pl.col("linked").any()
    return (
        colls.sort(order, nulls_last=True)
        .with_columns(
            pl.when(numbered)
            .then(pl.int_range(pl.len(), dtype=pl.Int64).over("group_key", "linked"))
            .alias("seq_in_group")
        )
        .sort("ts_ns", "event_id")
        .drop("_window")
    )

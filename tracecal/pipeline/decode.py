"""Decode a stored run: read each rank's events from DuckDB, write operators, collectives, iterations.

Called inside the ingest's per-run transaction after the run's events, ranks and runs rows are in
place (``tracecal.pipeline.ingest``); callable again on its own to re-decode (e.g. with another
``--iteration-marker``): the run's derived rows are replaced. Never opens or commits a transaction.
The statements it runs on the database are in ``tracecal.sql.loaders``.

Decoding has a per-rank half (``decode_rank_parts``: operators, the rank's collective instances and
iteration spans) and a cross-rank half (matching, clock alignment, topology, best iteration). Inside
ingest a worker does the per-rank half of the rank it parsed (``tracecal.pipeline.rank_decode``) and
the loader only the cross-rank half; a re-decode does both here.

Memory: one batch of ranks' events at a time, and a rank of more than ``WINDOW_EVENTS`` events one
decode window of iterations at a time (docs/decode.md#windows: the rows are those of decoding the
whole rank); the cross-rank steps work on the small collectives and iterations frames only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from tracecal.decode.align import apply_offsets, best_iteration, clock_offsets, match_collectives
from tracecal.decode.frames import with_series
from tracecal.decode.iterations import DEFAULT_MARKER, MARKER_KINDS, iteration_windows
from tracecal.decode.rank import DECODE_COLUMNS, RankDecode, decode_ranks
from tracecal.decode.topology import group_topology
from tracecal.decode.windows import (
    RankWindow,
    crossing_windows,
    events_per_iteration,
    number_in_group,
    window_firsts,
)
from tracecal.errors import TraceFormatError
from tracecal.schema import COLLECTIVES, ITERATIONS, OPERATORS
from tracecal.sql.loaders import (
    delete_derived_rows,
    event_counts,
    event_names,
    events_by_id,
    insert_frame,
    launch_lags,
    mark_run,
    named_events,
    read_events,
    read_window_events,
    set_clock_offsets,
    window_intervals,
    window_times,
)
from tracecal.vocabulary import GPU_ACTIVITY_KINDS, RUNTIME_KINDS, ParallelLayout


@dataclass(frozen=True)
class DecodeSummary:
    """What decoding a run produced (figures for the ingest summary and ``tracecal iterations``).

    Attributes:
        run_id: the run.
        ranks: ranks decoded.
        operators: operator rows written.
        unlinked_operators: operators without a CPU operator (kept, counted).
        linked_kernel_share: share of kernel time linked to a CPU operator (0-1); None without kernels.
        collectives: collective instance rows written.
        matched_instances: distinct match ids (instances seen on at least two ranks).
        unmatched_collectives: collective rows without a match id in a multi-rank run.
        iterations: iteration rows written (all ranks).
        markers_found: every rank had iteration markers (else: one iteration per rank, said so).
        best_iteration: the run's best iteration (see docs/decode.md), None when there is none.
        best_iteration_ns: the slowest rank's span of the best iteration.
        seconds: wall time of the decode.
    """

    run_id: str
    ranks: int
    operators: int
    unlinked_operators: int
    linked_kernel_share: float | None
    collectives: int
    matched_instances: int
    unmatched_collectives: int
    iterations: int
    markers_found: bool
    best_iteration: int | None
    best_iteration_ns: int | None
    seconds: float


BATCH_EVENTS = 500_000
"""Ranks are decoded together until their events reach this many rows: small ranks share the fixed
cost of each frame operation, and a batch (or one large rank) bounds the memory held at once."""


WINDOW_EVENTS = 1_000_000
"""A rank of more events than this is decoded a window of consecutive iterations at a time, each of
at most this many events (docs/decode.md#windows), so that decoding it needs memory for a window,
not for the rank."""


def _batches(sizes: list[tuple[int, int]], budget: int) -> list[tuple[int, int]]:
    """Consecutive rank ranges ``(first, last)`` whose event counts add up to at most ``budget``
    (a rank larger than the budget is a batch of its own)."""
    out: list[tuple[int, int]] = []
    first = last = -1
    total = 0
    for rank, n in sizes:
        if total and total + n > budget:
            out.append((first, last))
            total = 0
        if total == 0:
            first = rank
        total += n
        last = rank
    if total:
        out.append((first, last))
    return out


def _units(sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``_batches`` of the ranks of at most ``WINDOW_EVENTS`` events, in rank order, and each larger
    rank as a batch of its own (decoded in windows)."""
    out: list[tuple[int, int]] = []
    small: list[tuple[int, int]] = []
    for rank, n in sizes:
        if n > WINDOW_EVENTS:
            out += _batches(small, BATCH_EVENTS)
            out.append((rank, rank))
            small = []
        else:
            small.append((rank, n))
    return out + _batches(small, BATCH_EVENTS)


@dataclass(frozen=True)
class _WindowedRank:
    """A rank decoded in windows: its collectives (numbered as the whole rank's) and iterations."""

    collectives: pl.DataFrame
    iterations: pl.DataFrame
    markers_found: bool = True


def _iterations_of(con: duckdb.DuckDBPyConnection, run_id: str, rank: int, marker: str | None) -> pl.DataFrame | None:
    """The rank's iteration windows, from its marker candidates only; None when it has no marker
    (its capture is one iteration, which cannot be split) or a marker without a time."""
    names = pl.Series("name", event_names(con, run_id, rank, MARKER_KINDS), dtype=pl.Utf8)
    matching = names.filter(names.str.contains(marker or DEFAULT_MARKER)).to_list()
    if not matching:
        return None
    read = pl.from_arrow(named_events(con, run_id, rank, MARKER_KINDS, matching))
    assert isinstance(read, pl.DataFrame)
    if read.get_column("ts_ns").null_count() or read.get_column("end_ns").null_count():
        return None
    return iteration_windows(read, marker)


def _decode_in_windows(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    rank: int,
    *,
    layout: ParallelLayout,
    marker: str | None,
    parts: RankParts,
    write: OperatorSink,
) -> _WindowedRank | None:
    """Decode one rank a window of iterations at a time (docs/decode.md#windows), writing its
    operators; None when the rank is a single window (the caller decodes it whole).

    Windows are decoded last first: a CPU operator that starts in one window and encloses one of a
    later window is then known to be no leaf when its own window is decoded.
    """
    its = _iterations_of(con, run_id, rank, marker)
    if its is None:
        return None
    starts = its.get_column("cpu_start_ns").to_list()
    firsts = window_firsts(starts, _events_per_iteration(con, run_id, rank, starts), WINDOW_EVENTS)
    if len(firsts) < 2:
        return None
    bounds = [starts[f] for f in firsts[1:]]  # the CPU start of each window after the first
    gpu_events, min_lag, max_lag = launch_lags(con, run_id, rank, GPU_ACTIVITY_KINDS, RUNTIME_KINDS)
    context, first_window, last_window = _context_rows(con, run_id, rank, bounds)
    positions = np.arange(its.height)
    ends = [*firsts[1:], its.height]
    collectives: list[pl.DataFrame] = []
    iterations: list[pl.DataFrame] = []
    not_leaves = np.zeros(0, dtype=np.int64)
    for w in reversed(range(len(firsts))):
        lo = bounds[w - 1] if w else None
        hi = bounds[w] if w < len(bounds) else None
        read = pl.from_arrow(
            read_window_events(
                con,
                run_id,
                rank,
                DECODE_COLUMNS,
                (GPU_ACTIVITY_KINDS, RUNTIME_KINDS),
                _read_bounds(lo, hi, min_lag, max_lag),
            )
        )
        assert isinstance(read, pl.DataFrame)
        extra = context.filter(((first_window <= w) & (last_window >= w)).to_numpy())
        events = (
            pl.concat([read, extra], how="vertical_relaxed").sort("event_id") if extra.height else read.sort("event_id")
        )
        window = RankWindow(
            iterations=its.filter(pl.Series((positions >= firsts[w]) & (positions < ends[w]))),
            gpu=gpu_events > 0,
            context_ids=extra.get_column("event_id").to_numpy(),
            not_leaves=not_leaves,
        )
        del read, extra
        decoded = decode_ranks(events, layout=layout, marker=marker, window=window)
        del events
        write(decoded.operators)
        parts.add_operators(decoded.operators)
        collectives.append(decoded.collectives)
        iterations.append(decoded.iterations)
        not_leaves = np.union1d(not_leaves, decoded.context_not_operators)
        del decoded
    collectives.reverse()
    iterations.reverse()
    return _WindowedRank(
        collectives=number_in_group(collectives, gpu=gpu_events > 0),
        iterations=pl.concat(iterations, how="vertical_relaxed"),
    )


def _events_per_iteration(con: duckdb.DuckDBPyConnection, run_id: str, rank: int, starts: list[int]) -> list[int]:
    """The rank's events per iteration of ``starts``, counted from their times a batch at a time."""
    counts = np.zeros(len(starts), dtype=np.int64)
    for batch in window_times(con, run_id, rank):
        ts = batch.column("ts_ns")
        missing = ts.is_null().to_numpy(zero_copy_only=False) if ts.null_count else None
        counts += events_per_iteration(starts, ts.fill_null(0).to_numpy(), missing)
    return counts.tolist()


def _context_rows(
    con: duckdb.DuckDBPyConnection, run_id: str, rank: int, bounds: list[int]
) -> tuple[pl.DataFrame, pl.Series, pl.Series]:
    """The rank's CPU intervals that cross a window start of ``bounds`` (their ``DECODE_COLUMNS``), and
    the first and last window each is context for: found from their times a batch at a time
    (``crossing_windows``), then only those rows read whole."""
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for batch in window_intervals(con, run_id, rank, GPU_ACTIVITY_KINDS):
        found.append(
            crossing_windows(
                batch.column("event_id").to_numpy(),
                batch.column("ts_ns").to_numpy(),
                batch.column("end_ns").to_numpy(),
                bounds,
            )
        )
    ids, firsts, lasts = (
        (np.concatenate(parts) for parts in zip(*found, strict=True)) if found else (np.zeros(0, np.int64),) * 3
    )
    rows = pl.from_arrow(events_by_id(con, run_id, rank, DECODE_COLUMNS, ids.tolist()))
    assert isinstance(rows, pl.DataFrame)
    # the rows in event order, each with its windows
    order = np.argsort(ids, kind="stable")
    windows = pl.DataFrame({"event_id": ids[order], "first_window": firsts[order], "last_window": lasts[order]})
    rows = rows.sort("event_id").join(windows, on="event_id", how="left", maintain_order="left")
    return rows.drop("first_window", "last_window"), rows.get_column("first_window"), rows.get_column("last_window")


def _read_bounds(lo: int | None, hi: int | None, min_lag: int | None, max_lag: int | None) -> dict[str, int | None]:
    """The ranges ``read_window_events`` reads for the window [lo, hi) (None: open): GPU rows by their
    own start, within the launch lags of the window (an activity without a launch lies in it by its
    own start, so the range holds [lo, hi) too), and their runtime calls, within the lags of those."""
    least, most = min_lag or 0, max_lag or 0
    gpu_lo = None if lo is None else lo + min(least, 0)
    gpu_hi = None if hi is None else hi + max(most, 0)
    return {
        "lo": lo,
        "hi": hi,
        "gpu_lo": gpu_lo,
        "gpu_hi": gpu_hi,
        "runtime_lo": None if gpu_lo is None else gpu_lo - most,
        "runtime_hi": None if gpu_hi is None else gpu_hi - least,
    }


def _layout(con: duckdb.DuckDBPyConnection, run_id: str, marker: str) -> ParallelLayout:
    """Record the iteration marker in the run's row and read the run's layout from it."""
    world, pp, tp, dp, nodes, gpn = mark_run(con, run_id, marker)
    return ParallelLayout(pp=pp, tp=tp, dp=dp, nodes=nodes, gpus_per_node=gpn, world_size=world)


@dataclass(frozen=True)
class JustStored:
    """What the loader knows of a run it has just stored in this transaction (its old rows deleted).

    Attributes:
        layout: the layout (with world size) its ``runs`` row holds, written with the marker decode uses.
        decoded: the ranks workers decoded with that layout (operators stored, parts kept).
    """

    layout: ParallelLayout
    decoded: Mapping[int, RankParts]


@dataclass
class RankParts:
    """The per-rank half of decoding some ranks: their operators are written (``write``), their
    collectives (not yet matched across ranks) and iterations (not yet aligned) kept for the run.

    Built by the loader from the stored events, or by a worker from the rank it parsed
    (``tracecal.pipeline.rank_decode``) and combined by the loader with ``extend``."""

    collectives: list[pl.DataFrame]
    iterations: list[pl.DataFrame]
    markers_found: bool = True
    operators: int = 0
    unlinked: int = 0
    kernel_ns: int = 0
    linked_ns: int = 0

    @classmethod
    def empty(cls) -> RankParts:
        return cls([], [])

    def add_operators(self, ops: pl.DataFrame) -> None:
        """Count what ``DecodeSummary`` reports of the operators (series operations: no query plan each)."""
        self.operators += ops.height
        cpu_op, dur = ops.get_column("cpu_op_event_id"), ops.get_column("dur_ns")
        kernel = ops.get_column("kind") == "kernel"
        self.unlinked += cpu_op.null_count()
        self.kernel_ns += int(dur.filter(kernel).sum() or 0)
        self.linked_ns += int(dur.filter(kernel & cpu_op.is_not_null()).sum() or 0)

    def extend(self, other: RankParts) -> None:
        self.collectives += other.collectives
        self.iterations += other.iterations
        self.markers_found = self.markers_found and other.markers_found
        self.operators += other.operators
        self.unlinked += other.unlinked
        self.kernel_ns += other.kernel_ns
        self.linked_ns += other.linked_ns


OperatorSink = Callable[[pl.DataFrame], None]
"""Where decoded operators go: inserted into the database, or into a worker's Parquet shard."""


def decode_rank_parts(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    sizes: list[tuple[int, int]],
    *,
    layout: ParallelLayout,
    marker: str | None,
    write: OperatorSink,
    on_rank: Callable[[int], None] | None = None,
) -> RankParts:
    """The per-rank half of decoding the ranks of ``sizes`` (``(rank, events)``) whose events the
    ``events`` table of ``con`` holds: small ranks in batches, a rank of more than ``WINDOW_EVENTS``
    events a window of iterations at a time. Operators go to ``write``."""
    parts = RankParts.empty()
    windowed = {rank for rank, n in sizes if n > WINDOW_EVENTS}
    for first, last in _units(sizes):
        decoded: RankDecode | _WindowedRank | None = None
        if first == last and first in windowed:
            decoded = _decode_in_windows(con, run_id, first, layout=layout, marker=marker, parts=parts, write=write)
        if decoded is None:  # a batch of ranks, or a rank that is one window (no markers)
            # only the columns decode reads; sorted here, not by DuckDB (its ORDER BY costs more than
            # the rest of the read)
            events = pl.from_arrow(read_events(con, run_id, DECODE_COLUMNS, first, last))
            assert isinstance(events, pl.DataFrame)
            if not (events["rank"].cast(pl.Int64) * (1 << 40) + events["event_id"]).is_sorted():
                events = events.sort("rank", "event_id")
            decoded = decode_ranks(events, layout=layout, marker=marker)
            del events
            write(decoded.operators)
            parts.add_operators(decoded.operators)
        parts.collectives.append(decoded.collectives)
        parts.iterations.append(decoded.iterations)
        parts.markers_found = parts.markers_found and decoded.markers_found
        del decoded
        if on_rank is not None:
            for rank, _ in sizes:
                if first <= rank <= last:
                    on_rank(rank)
    return parts


def check_marker(iteration_marker: str | None) -> str:
    """The marker regex (default ``ProfilerStep#N``), checked before anything is written.

    Raises:
        TraceFormatError: not a valid regex.
    """
    marker = iteration_marker or DEFAULT_MARKER
    try:
        re.compile(marker)
    except re.error as exc:
        raise TraceFormatError(f"--iteration-marker {marker!r} is not a valid regex: {exc}") from exc
    return marker


def decode_stored_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    *,
    iteration_marker: str | None = None,
    on_rank: Callable[[int], None] | None = None,
    stored: JustStored | None = None,
) -> DecodeSummary:
    """Decode the run's stored events into ``operators``, ``collectives`` and ``iterations``.

    Also sets ``ranks.clock_offset_ns`` / ``clock_residual_ns`` and ``runs.iteration_marker``.

    Args:
        con: an open database connection (the caller owns any transaction).
        run_id: a run whose ``runs``, ``ranks`` and ``events`` rows are stored.
        iteration_marker: regex delimiting iterations; None means ``ProfilerStep#N``.
        on_rank: called with each rank after its batch is decoded (progress reporting).
        stored: given by the loader inside ingest, right after it replaced the run's rows: the
            layout its ``runs`` row holds (not read back) and the ranks workers decoded.

    Raises:
        RunNotFoundError: the run is not in the database.
        TraceFormatError: ``iteration_marker`` is not a valid regex.
    """
    started = time.perf_counter()
    marker = check_marker(iteration_marker)
    if stored is not None:  # the loader wrote the runs row with this marker and deleted the old rows
        layout = stored.layout
    else:
        layout = _layout(con, run_id, marker)
        delete_derived_rows(con, run_id)
    sizes = event_counts(con, run_id)
    ranks = [r for r, _ in sizes]
    done = dict(stored.decoded) if stored is not None else {}
    parts = decode_rank_parts(
        con,
        run_id,
        [(r, n) for r, n in sizes if r not in done],
        layout=layout,
        marker=iteration_marker,
        write=lambda ops: insert_frame(con, OPERATORS, ops, run_id),
        on_rank=on_rank,
    )
    for rank in ranks:
        if rank in done:
            parts.extend(done[rank])
            if on_rank is not None:
                on_rank(rank)
    if not ranks:  # no complete events at all: nothing to derive, and nothing half-written either
        return DecodeSummary(run_id, 0, 0, 0, None, 0, 0, 0, 0, False, None, None, time.perf_counter() - started)
    # in rank order, each rank's rows in decode's order (ties in the cross-rank steps keep it)
    colls = _by_rank(pl.concat(parts.collectives, how="vertical_relaxed"))
    its = _by_rank(pl.concat(parts.iterations, how="vertical_relaxed"))
    if len(ranks) > 1:
        colls = match_collectives(colls)
    else:  # a single rank has nobody to match with
        colls = with_series(colls, pl.Series("match_id", [None] * colls.height, dtype=pl.Int64))
    offsets = clock_offsets(colls, ranks)
    its, colls = apply_offsets(its, colls, offsets)
    set_clock_offsets(
        con,
        run_id,
        offsets["rank"].to_list(),
        offsets["clock_offset_ns"].to_list(),
        offsets["clock_residual_ns"].to_list(),
    )
    if colls.height:
        colls = group_topology(colls, layout.gpus_per_node, world_size=layout.world_size, nodes=layout.nodes)
        insert_frame(con, COLLECTIVES, colls, run_id)
    insert_frame(con, ITERATIONS, its, run_id)
    best = best_iteration(its)
    multi = len(ranks) > 1 and colls.height > 0
    return DecodeSummary(
        run_id=run_id,
        ranks=len(ranks),
        operators=parts.operators,
        unlinked_operators=parts.unlinked,
        linked_kernel_share=parts.linked_ns / parts.kernel_ns if parts.kernel_ns else None,
        collectives=colls.height,
        matched_instances=int(colls["match_id"].n_unique() - (1 if colls["match_id"].null_count() else 0))
        if colls.height
        else 0,
        unmatched_collectives=int(colls["match_id"].null_count()) if multi else 0,
        iterations=its.height,
        markers_found=parts.markers_found,
        best_iteration=int(best["iteration"][0]) if best.height else None,
        best_iteration_ns=int(best["dur_ns"][0]) if best.height else None,
        seconds=time.perf_counter() - started,
    )


def _by_rank(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with its ranks in order, the rows of a rank in the order they had (a stable sort)."""
    rank = frame.get_column("rank")
    return frame if rank.is_sorted() else frame.sort("rank", maintain_order=True)

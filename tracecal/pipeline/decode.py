"""Decode a stored run: read each rank's events from DuckDB, write operators, collectives, iterations.

Called inside the ingest's per-run transaction after the run's events, ranks and runs rows are in
place (``tracecal.pipeline.ingest``); callable again on its own to re-decode (e.g. with another
``--iteration-marker``): the run's derived rows are replaced. Never opens or commits a transaction.
The statements it runs on the database are in ``tracecal.sql.loaders``.

Inside ingest the loader hands over the events it has just stored (``DecodeHandoff``), so a run of
up to ``BATCH_EVENTS`` events is decoded without reading it back from DuckDB (for a small trace, the
read-back, the per-rank counts and the check for earlier derived rows cost as much as decoding it);
larger runs, and re-decodes, read the events back in batches.

Memory: one batch of ranks' events at a time, and a rank of more than ``WINDOW_EVENTS`` events one
decode window of iterations at a time (docs/decode.md#windows: the rows are those of decoding the
whole rank); the cross-rank steps work on the small collectives and iterations frames only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from tracecal.decode.align import apply_offsets, best_iteration, clock_offsets, match_collectives
from tracecal.decode.frames import with_series
from tracecal.decode.iterations import DEFAULT_MARKER, MARKER_KINDS, iteration_windows
from tracecal.decode.link import GPU_KINDS, RUNTIME_KINDS
from tracecal.decode.rank import DECODE_COLUMNS, RankDecode, decode_ranks
from tracecal.decode.topology import group_topology
from tracecal.decode.windows import RankWindow, number_in_group, window_firsts
from tracecal.errors import TraceFormatError
from tracecal.ingest.discover import ParallelLayout
from tracecal.schema import COLLECTIVES, EVENTS, ITERATIONS, OPERATORS, arrow_schema
from tracecal.sql.loaders import (
    crossing_intervals,
    delete_derived_rows,
    event_counts,
    event_names,
    events_per_start,
    has_derived_rows,
    insert_frame,
    launch_lags,
    mark_run,
    named_events,
    read_events,
    read_window_events,
    set_clock_offsets,
)


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


class _OperatorTotals:
    """Writes decoded operators and keeps the figures ``DecodeSummary`` reports of them."""

    def __init__(self) -> None:
        self.operators = self.unlinked = self.kernel_ns = self.linked_ns = 0

    def add(self, con: duckdb.DuckDBPyConnection, run_id: str, ops: pl.DataFrame) -> None:
        insert_frame(con, OPERATORS, ops, run_id)
        self.operators += ops.height
        # series operations: no query plan each
        cpu_op, dur = ops.get_column("cpu_op_event_id"), ops.get_column("dur_ns")
        kernel = ops.get_column("kind") == "kernel"
        self.unlinked += cpu_op.null_count()
        self.kernel_ns += int(dur.filter(kernel).sum() or 0)
        self.linked_ns += int(dur.filter(kernel & cpu_op.is_not_null()).sum() or 0)

    @property
    def linked_kernel_share(self) -> float | None:
        return self.linked_ns / self.kernel_ns if self.kernel_ns else None


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
    totals: _OperatorTotals,
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
    firsts = window_firsts(starts, events_per_start(con, run_id, rank, starts), WINDOW_EVENTS)
    if len(firsts) < 2:
        return None
    bounds = [starts[f] for f in firsts[1:]]  # the CPU start of each window after the first
    gpu_events, min_lag, max_lag = launch_lags(con, run_id, rank, GPU_KINDS, RUNTIME_KINDS)
    context = pl.from_arrow(crossing_intervals(con, run_id, rank, DECODE_COLUMNS, GPU_KINDS, bounds))
    assert isinstance(context, pl.DataFrame)
    first_window, last_window = context.get_column("first_window"), context.get_column("last_window")
    context = context.drop("first_window", "last_window")
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
                con, run_id, rank, DECODE_COLUMNS, (GPU_KINDS, RUNTIME_KINDS), _read_bounds(lo, hi, min_lag, max_lag)
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
        totals.add(con, run_id, decoded.operators)
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


def _layout(con: duckdb.DuckDBPyConnection, run_id: str, marker: str, fresh: bool) -> tuple[ParallelLayout, bool]:
    """Record the iteration marker and read the run's layout, and whether it already has derived
    rows (a re-decode; not asked when ``fresh``: a first decode inside ingest has no rows to delete)."""
    world, pp, tp, dp, nodes, gpn = mark_run(con, run_id, marker)
    derived = False if fresh else has_derived_rows(con, run_id)
    return ParallelLayout(pp=pp, tp=tp, dp=dp, nodes=nodes, gpus_per_node=gpn, world_size=world), derived


def _as_type(column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """``column`` cast to ``target``; as it is when it has that type already (a no-op cast still
    costs tens of microseconds, and the hand-off has 28 columns per table)."""
    return column if column.type == target else column.cast(target)


class DecodeHandoff:
    """The events the loader stores for a run, kept for its decode (only the ``DECODE_COLUMNS``).

    The loader calls ``keep`` with every table it inserts into ``events`` (``run_id`` and ``rank``
    filled in) and passes the handoff to ``decode_stored_run``. Once the run exceeds
    ``BATCH_EVENTS`` events the tables are dropped and decode reads the run back in batches, so a
    large run is never held whole.

    The loader also sets ``layout`` (with ``world_size``) and ``iteration_marker`` to what it wrote in
    the run's ``runs`` row: decode then neither asks for the layout nor records the marker when the row
    already holds it (an ``UPDATE ... RETURNING`` costs as much as a few frame operations).
    """

    def __init__(self) -> None:
        self._tables: list[pa.Table] | None = []
        self._rows = 0
        self.layout: ParallelLayout | None = None
        self.iteration_marker: str | None = None

    def keep(self, events: pa.Table) -> None:
        """Keep (a column selection of) one inserted table of events, within the budget."""
        if self._tables is None:
            return
        self._rows += events.num_rows
        if self._rows > BATCH_EVENTS:
            self._tables = None
            return
        self._tables.append(events.select([c for c in DECODE_COLUMNS if c in events.schema.names]))

    def keep_none(self) -> None:
        """Events were stored without passing through ``keep`` (read from a file): decode reads the run back."""
        self._tables = None

    def events(self) -> pl.DataFrame | None:
        """Every kept event with the ``DECODE_COLUMNS`` as read back from ``events`` (same types,
        absent columns NULL, dictionary-encoded strings decoded); None when over the budget."""
        if self._tables is None:
            return None
        schema = arrow_schema(EVENTS)
        runs: list[list[pa.Table]] = []  # consecutive tables of one schema: concatenated, then cast once
        for table in self._tables:
            if runs and runs[-1][0].schema == table.schema:
                runs[-1].append(table)
            else:
                runs.append([table])
        tables = []
        for run in runs:
            table = pa.concat_tables(run) if len(run) > 1 else run[0]
            columns = [
                _as_type(table.column(c), schema.field(c).type)
                if c in table.schema.names
                else pa.nulls(table.num_rows, schema.field(c).type)
                for c in DECODE_COLUMNS
            ]
            tables.append(pa.table(columns, names=list(DECODE_COLUMNS)))
        if not tables:
            tables.append(
                pa.table([pa.array([], schema.field(c).type) for c in DECODE_COLUMNS], names=list(DECODE_COLUMNS))
            )
        frame = pl.from_arrow(pa.concat_tables(tables) if len(tables) > 1 else tables[0])
        assert isinstance(frame, pl.DataFrame)
        return frame


def decode_stored_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    *,
    iteration_marker: str | None = None,
    on_rank: Callable[[int], None] | None = None,
    handoff: DecodeHandoff | None = None,
) -> DecodeSummary:
    """Decode the run's stored events into ``operators``, ``collectives`` and ``iterations``.

    Also sets ``ranks.clock_offset_ns`` / ``clock_residual_ns`` and ``runs.iteration_marker``.

    Args:
        con: an open database connection (the caller owns any transaction).
        run_id: a run whose ``runs``, ``ranks`` and ``events`` rows are stored.
        iteration_marker: regex delimiting iterations; None means ``ProfilerStep#N``.
        on_rank: called with each rank after its batch is decoded (progress reporting).
        handoff: the events the loader stored for the run in this transaction, after deleting
            everything the run had (so there are no derived rows to replace); decoded without
            reading them back unless the run was too large to keep. None: read from the database.

    Raises:
        RunNotFoundError: the run is not in the database.
        TraceFormatError: ``iteration_marker`` is not a valid regex.
    """
    started = time.perf_counter()
    marker = iteration_marker or DEFAULT_MARKER
    try:  # before anything is written
        re.compile(marker)
    except re.error as exc:
        raise TraceFormatError(f"--iteration-marker {marker!r} is not a valid regex: {exc}") from exc
    given = handoff.events() if handoff is not None else None
    if handoff is not None and handoff.layout is not None and handoff.iteration_marker == marker:
        layout, derived = handoff.layout, False  # the loader's row says it all
    else:
        layout, derived = _layout(con, run_id, marker, fresh=handoff is not None)
    if derived:
        delete_derived_rows(con, run_id)
    if given is not None:
        ranks = np.unique(given.get_column("rank").to_numpy()).tolist()  # a series ``unique`` plans a query
        batches = [(ranks[0], ranks[-1])] if ranks else []
    else:
        sizes = event_counts(con, run_id)
        ranks = [r for r, _ in sizes]
        batches = _units(sizes)
        windowed = {rank for rank, n in sizes if n > WINDOW_EVENTS}
    collectives: list[pl.DataFrame] = []
    iterations: list[pl.DataFrame] = []
    totals = _OperatorTotals()
    markers = True
    for first, last in batches:
        decoded: RankDecode | _WindowedRank | None = None
        if given is None and first == last and first in windowed:
            decoded = _decode_in_windows(con, run_id, first, layout=layout, marker=iteration_marker, totals=totals)
        if decoded is None:  # a batch of ranks, or a rank that is one window (no markers)
            if given is not None:  # the whole run, as the loader stored it (one batch)
                events, given = given, None
            else:
                # only the columns decode reads; sorted here, not by DuckDB (its ORDER BY costs more
                # than the rest of the read)
                read = pl.from_arrow(read_events(con, run_id, DECODE_COLUMNS, first, last))
                assert isinstance(read, pl.DataFrame)
                events = read
            if not (events["rank"].cast(pl.Int64) * (1 << 40) + events["event_id"]).is_sorted():
                events = events.sort("rank", "event_id")
            decoded = decode_ranks(events, layout=layout, marker=iteration_marker)
            del events
            totals.add(con, run_id, decoded.operators)
        collectives.append(decoded.collectives)
        iterations.append(decoded.iterations)
        markers = markers and decoded.markers_found
        del decoded
        if on_rank is not None:
            for rank in ranks:
                if first <= rank <= last:
                    on_rank(rank)

    if not ranks:  # no complete events at all: nothing to derive, and nothing half-written either
        return DecodeSummary(run_id, 0, 0, 0, None, 0, 0, 0, 0, False, None, None, time.perf_counter() - started)
    colls = pl.concat(collectives, how="vertical_relaxed")
    its = pl.concat(iterations, how="vertical_relaxed")
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
        operators=totals.operators,
        unlinked_operators=totals.unlinked,
        linked_kernel_share=totals.linked_kernel_share,
        collectives=colls.height,
        matched_instances=int(colls["match_id"].n_unique() - (1 if colls["match_id"].null_count() else 0))
        if colls.height
        else 0,
        unmatched_collectives=int(colls["match_id"].null_count()) if multi else 0,
        iterations=its.height,
        markers_found=markers,
        best_iteration=int(best["iteration"][0]) if best.height else None,
        best_iteration_ns=int(best["dur_ns"][0]) if best.height else None,
        seconds=time.perf_counter() - started,
    )

"""Decode ranks: events -> operators, collective instances, iteration spans (pure).

This is the per-rank half of decoding; the cross-rank half (matching, clock alignment, best
iteration) is ``tracecal.decode.align``. Several small ranks can be decoded in one call (a batch):
every step keys on ``rank`` (and the batch-wide ``uid``), so nothing crosses ranks, and the fixed
cost of each frame operation is paid once per batch instead of once per rank.

A large rank is decoded a window of iterations at a time instead (``tracecal.decode.windows``): the
window then brings what it must know of the rest of its rank (``RankWindow``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from tracecal.decode import classify, collectives, link
from tracecal.decode.classify import component_expr, phases_plan
from tracecal.decode.collectives import rank_collectives
from tracecal.decode.frames import coalesce, with_series
from tracecal.decode.iterations import DEFAULT_MARKER, iteration_spans, iteration_windows, window_of
from tracecal.decode.link import (
    cpu_leaf_operators,
    end_series,
    link_gpu_operators,
    outermost_scope,
    uid_series,
)
from tracecal.decode.nesting import ENGINE, NameIndex
from tracecal.decode.shape_features import family_shape_table
from tracecal.decode.windows import RankWindow
from tracecal.schema import OPERATORS
from tracecal.vocabulary import GPU_ACTIVITY_KINDS, ParallelLayout

DECODE_COLUMNS = (
    "rank", "event_id", "kind", "name", "ts_ns", "dur_ns", "pid", "tid", "device", "stream", "correlation",
    "external_id", "sequence_number", "fwd_thread_id", "input_dims", "input_types", "concrete_inputs", "bytes",
    "coll_name", "in_msg_nelems", "out_msg_nelems", "group_size", "coll_dtype", "pg_name", "pg_ranks", "coll_seq",
    "src_rank", "dst_rank",
)  # fmt: skip
"""The ``events`` columns decoding reads (the others are not needed: reading them back costs time)."""


@dataclass(frozen=True)
class RankDecode:
    """What decoding one or more ranks produces.

    Attributes:
        operators: ``schema.OPERATORS`` columns (run_id NULL).
        collectives: ``rank_collectives`` rows (not yet matched across ranks).
        iterations: ``schema.ITERATIONS`` columns except run_id and aligned_* .
        gpu_ranks: ranks with GPU activity (the others are CPU-only).
        unmarked_ranks: ranks without iteration markers (their capture is one iteration).
        context_not_operators: a window of a CPU-only rank: event ids of its context rows that are no
            operator of it (a CPU operator among them encloses one here, so it is no leaf).
    """

    operators: pl.DataFrame
    collectives: pl.DataFrame
    iterations: pl.DataFrame
    gpu_ranks: frozenset[int]
    unmarked_ranks: frozenset[int]
    context_not_operators: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def gpu(self) -> bool:
        """Some rank had GPU activity."""
        return bool(self.gpu_ranks)

    @property
    def markers_found(self) -> bool:
        """Every rank had iteration markers."""
        return not self.unmarked_ranks


def decode_ranks(
    events: pl.DataFrame, *, layout: ParallelLayout, marker: str | None = None, window: RankWindow | None = None
) -> RankDecode:
    """Decode the events of one or more ranks (a ``rank`` column tells them apart).

    Args:
        events: rows of ``events`` with at least the ``DECODE_COLUMNS`` (run_id and the others ignored).
        layout: the run's parallel layout (for collective roles).
        marker: iteration-marker regex; None means ``ProfilerStep#N``.
        window: ``events`` are one decode window of a single rank (its events and context rows,
            sorted by event id); None: whole ranks.

    Raises:
        TraceFormatError: ``marker`` is not a valid regex.
    """
    # series operations where they do (a frame operation plans a query first, a fixed cost that
    # dominates on small traces)
    uid = uid_series(events)
    if uid.is_sorted():  # as read back: later sorts by uid take polars' fast path
        uid = uid.set_sorted()
    ev = pl.DataFrame([*(events.get_column(c) for c in DECODE_COLUMNS), end_series(events), uid])  # ``with_end``
    rank = ev.get_column("rank").to_numpy()
    all_ranks = np.unique(rank)
    kind = ev.get_column("kind")
    kind = kind.fill_null("") if kind.null_count() else kind
    if window is None:
        # ``is_in`` plans a query
        on_gpu_kind = np.logical_or.reduce([(kind == k).to_numpy() for k in GPU_ACTIVITY_KINDS])
        gpu_ranks = frozenset(np.unique(rank[on_gpu_kind]).tolist())
    else:  # decided on the whole rank: a window without GPU activity stays a GPU rank
        gpu_ranks = frozenset(all_ranks.tolist()) if window.gpu else frozenset()
    on_gpu = pl.col("rank").is_in(list(gpu_ranks))
    # each regex once per distinct name; the collectives' context patterns only when the batch has
    # instances, the metadata-op pattern only when it has CPU-only ranks (compiling and running a
    # regex has a fixed cost, more in a fresh process)
    first = [marker or DEFAULT_MARKER, *link.NAME_PATTERNS, *classify.NAME_PATTERNS, *collectives.INSTANCE_PATTERNS]
    if len(gpu_ranks) == len(all_ranks):
        first.remove(link.METADATA_OPS)
    names = NameIndex(ev, first, later=collectives.CONTEXT_PATTERNS)
    windows = iteration_windows(ev, marker, names) if window is None else window.iterations
    parts = []
    mixed = 0 < len(gpu_ranks) < len(all_ranks)  # else no copy of the events by rank
    if gpu_ranks:
        parts.append(link_gpu_operators(ev.filter(on_gpu) if mixed else ev, names))
    if len(gpu_ranks) < len(all_ranks):
        parts.append(cpu_leaf_operators(ev.filter(~on_gpu) if mixed else ev, names))
    ops = parts[0] if len(parts) == 1 else pl.concat(parts, how="vertical_relaxed")
    context_not_operators = np.zeros(0, dtype=np.int64)
    if window is not None and not window.gpu and (len(window.context_ids) or len(window.not_leaves)):
        # a context row is output by the window it starts in, which must learn whether it is a leaf
        ids = ops.get_column("event_id").to_numpy()
        context_not_operators = np.setdiff1d(window.context_ids, ids)
        ops = ops.filter(~pl.Series(np.isin(ids, np.concatenate([window.context_ids, window.not_leaves]))))
    ops = outermost_scope(ev, ops, names=names)
    when = coalesce(ops.get_column("launch_ns"), ops.get_column("ts_ns"))
    ops = with_series(ops, window_of(ops.get_column("rank"), when, windows))
    # collectives, families and shapes read no phase: the phases are planned, not collected, and
    # finished in the final plan with the family / shape table and the collectives' roles
    colls = rank_collectives(ev, ops, layout=layout, gpu_ranks=gpu_ranks, names=names)
    # family and shape features per distinct signature, joined in the final plan
    table = family_shape_table(ops)
    keys = table.columns[:6]  # the signature columns of ``ops`` it was built from
    phased = phases_plan(ev, ops, names).join(table.lazy(), on=keys, how="left", nulls_equal=True)
    if colls.height:
        phased = phased.join(colls.lazy().select("rank", "event_id", "role"), on=["rank", "event_id"], how="left")
    else:  # no instance: no join
        phased = phased.with_columns(pl.lit(None, dtype=colls.schema["role"]).alias("role"))
    ops = (
        phased.with_columns(component_expr())
        .with_columns(pl.col("rank").cast(pl.Int32), pl.lit(None, dtype=pl.Utf8).alias("run_id"))
        .select(OPERATORS.column_names)
        .sort("rank", "event_id")
        .collect(engine=ENGINE)
    )
    its = iteration_spans(windows, ops, gpu_ranks=gpu_ranks)
    return RankDecode(
        operators=ops,
        collectives=colls,
        iterations=its,
        gpu_ranks=gpu_ranks,
        unmarked_ranks=frozenset(windows.get_column("rank").filter(windows.get_column("marker").is_null()).to_list()),
        context_not_operators=context_not_operators,
    )


def decode_rank(events: pl.DataFrame, *, rank: int, layout: ParallelLayout, marker: str | None = None) -> RankDecode:
    """Decode one rank's events (``decode_ranks`` with the rank column set to ``rank``)."""
    return decode_ranks(events.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank")), layout=layout, marker=marker)

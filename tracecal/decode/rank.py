"""Decode one rank: events -> operators, collective instances, iteration spans (pure).

This is the per-rank half of decoding (bounded memory: one rank's events at a time); the cross-rank
half (matching, clock alignment, best iteration) is ``tracecal.decode.align``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracecal.decode.classify import assign_phases, component_expr
from tracecal.decode.collectives import Layout, rank_collectives
from tracecal.decode.iterations import assign_iterations, iteration_spans, iteration_windows
from tracecal.decode.link import cpu_leaf_operators, has_gpu_activity, link_gpu_operators, outermost_scope, with_end
from tracecal.decode.shapes import family_expr, shape_features
from tracecal.schema import OPERATORS


@dataclass(frozen=True)
class RankDecode:
    """What decoding one rank produces.

    Attributes:
        operators: ``schema.OPERATORS`` columns except run_id.
        collectives: ``rank_collectives`` rows (not yet matched across ranks).
        iterations: ``schema.ITERATIONS`` columns except run_id and aligned_* (rank filled).
        gpu: the rank has GPU activity.
        markers_found: iteration markers were found (else the capture is one iteration).
    """

    operators: pl.DataFrame
    collectives: pl.DataFrame
    iterations: pl.DataFrame
    gpu: bool
    markers_found: bool


def decode_rank(events: pl.DataFrame, *, rank: int, layout: Layout, marker: str | None = None) -> RankDecode:
    """Decode one rank's events.

    Args:
        events: the rank's rows of ``events`` (``schema.EVENTS`` columns; run_id ignored).
        rank: the global rank.
        layout: the run's parallel layout (for collective roles).
        marker: iteration-marker regex; None means ``ProfilerStep#N``.

    Raises:
        TraceFormatError: ``marker`` is not a valid regex.
    """
    ev = with_end(events)
    gpu = has_gpu_activity(ev)
    windows = iteration_windows(ev, marker)
    ops = link_gpu_operators(ev) if gpu else cpu_leaf_operators(ev)
    ops = outermost_scope(ev, ops)
    when = ops.select(pl.col("event_id").alias("qid"), pl.coalesce("launch_ns", "ts_ns").alias("t"))
    ops = ops.join(assign_iterations(when, windows).rename({"qid": "event_id"}), on="event_id", how="left")
    ops = ops.with_columns(family_expr("cpu_op_name", "name", "kind"))
    ops = assign_phases(ev, ops)
    colls = rank_collectives(ev, ops, rank=rank, layout=layout, gpu=gpu)
    ops = ops.join(colls.select("event_id", "role"), on="event_id", how="left")
    # a comm-family operator that is not a collective instance (a c10d op on a CPU-only rank)
    ops = ops.with_columns(component_expr())
    ops = shape_features(ops, name="cpu_op_name", concrete_inputs="cpu_concrete_inputs")
    ops = ops.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"), pl.lit(None, dtype=pl.Utf8).alias("run_id"))
    operators = ops.select(OPERATORS.column_names)
    its = iteration_spans(windows, ops, gpu=gpu).with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"))
    return RankDecode(
        operators=operators,
        collectives=colls,
        iterations=its,
        gpu=gpu,
        markers_found=windows["marker"].null_count() == 0,
    )

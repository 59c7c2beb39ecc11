"""Iteration windows and spans of one rank (SPEC §5.4), pure.

An iteration is a CPU window: ``ProfilerStep#N`` (default) or the ranges whose names match a
``--iteration-marker`` regex. GPU work belongs to the iteration whose CPU window *launched* it (the
runtime call's start), not to the window it happens to run in. A capture without markers is one
iteration (index 0, ``marker`` NULL) spanning all CPU activity.
"""

from __future__ import annotations

import re

import polars as pl

from tracecal.decode.nesting import enclosing
from tracecal.errors import TraceFormatError

DEFAULT_MARKER = r"^ProfilerStep#(\d+)$"
_MARKER_KINDS = ("user_annotation", "cpu_op", "python_function", "nvtx")
_CPU_KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "nvtx")


def iteration_windows(events: pl.DataFrame, marker: str | None = None) -> pl.DataFrame:
    """The iteration windows of one rank.

    Args:
        events: the rank's events (``schema.EVENTS`` columns plus ``end_ns``).
        marker: regex for iteration ranges; None means ``ProfilerStep#N``. When the regex has a
            numeric capture group (or the name ends in ``#N``) that number is the iteration index,
            otherwise windows are numbered 0, 1, ... in time order.

    Returns:
        Columns iteration (int32), marker, cpu_start_ns, cpu_end_ns; one row per window, time order.
        No marker found: one row (iteration 0, marker NULL) over all CPU events; no CPU events at
        all: the span of all events.

    Raises:
        TraceFormatError: ``marker`` is not a valid regular expression.
    """
    pattern = marker or DEFAULT_MARKER
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise TraceFormatError(f"--iteration-marker {pattern!r} is not a valid regex: {exc}") from exc
    cands = events.filter(pl.col("kind").is_in(_MARKER_KINDS) & pl.col("name").str.contains(pattern)).sort(
        "ts_ns", "event_id"
    )
    if cands.height:
        # nested or repeated matches (a framework marker inside a python frame of the same name):
        # keep only windows not enclosed by an earlier kept window
        cands = cands.with_columns(pl.col("end_ns").cum_max().shift(1).alias("_prev_end"))
        cands = cands.filter(pl.col("_prev_end").is_null() | (pl.col("ts_ns") >= pl.col("_prev_end")))
        numbers: list[int | None] = []
        for name in cands["name"].to_list():
            m = compiled.search(name)
            num = None
            if m and m.groups() and m.group(1) and m.group(1).isdigit():
                num = int(m.group(1))
            else:
                tail = re.search(r"#(\d+)$", name)
                num = int(tail.group(1)) if tail else None
            numbers.append(num)
        if any(n is None for n in numbers) or len(set(numbers)) != len(numbers):
            numbers = list(range(len(numbers)))
        return pl.DataFrame(
            {
                "iteration": pl.Series(numbers, dtype=pl.Int32),
                "marker": cands["name"],
                "cpu_start_ns": cands["ts_ns"],
                "cpu_end_ns": cands["end_ns"],
            }
        )
    cpu = events.filter(pl.col("kind").is_in(_CPU_KINDS))
    span = cpu if cpu.height else events
    return pl.DataFrame(
        {
            "iteration": pl.Series([0], dtype=pl.Int32),
            "marker": pl.Series([None], dtype=pl.Utf8),
            "cpu_start_ns": [span["ts_ns"].min()],
            "cpu_end_ns": [span["end_ns"].max()],
        },
        schema={"iteration": pl.Int32, "marker": pl.Utf8, "cpu_start_ns": pl.Int64, "cpu_end_ns": pl.Int64},
    )


def assign_iterations(points: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The iteration whose CPU window contains each point.

    Args:
        points: columns ``qid`` and ``t`` (ns; NULL allowed -> NULL iteration).
        windows: ``iteration_windows`` output (windows do not overlap).

    Returns:
        ``qid`` and ``iteration`` (int32, NULL outside every window).
    """
    iv = windows.select(
        pl.lit(0, dtype=pl.Int8).alias("lane"),
        pl.col("iteration").cast(pl.Int64).alias("id"),
        pl.col("cpu_start_ns").alias("ts_ns"),
        pl.col("cpu_end_ns").alias("end_ns"),
    )
    pts = points.filter(pl.col("t").is_not_null()).select(pl.lit(0, dtype=pl.Int8).alias("lane"), "qid", "t")
    hit = enclosing(iv, pts, lane=("lane",), outermost=True)
    out = points.select("qid").join(
        hit.select("qid", pl.col("id").cast(pl.Int32).alias("iteration")), on="qid", how="left"
    )
    return out


def iteration_spans(windows: pl.DataFrame, operators: pl.DataFrame, *, gpu: bool) -> pl.DataFrame:
    """Per-iteration CPU and GPU spans of one rank (``schema.ITERATIONS`` minus run/rank/aligned).

    Args:
        windows: ``iteration_windows`` output.
        operators: the rank's operators with ``iteration``, ``ts_ns``, ``dur_ns``.
        gpu: the rank has GPU activity (``dur_ns`` is then the GPU span, else the CPU span).

    Returns:
        iteration, marker, cpu_start_ns, cpu_end_ns, gpu_start_ns, gpu_end_ns, dur_ns.
    """
    g = (
        operators.filter(pl.col("iteration").is_not_null())
        .group_by("iteration")
        .agg(
            pl.col("ts_ns").min().alias("gpu_start_ns"),
            (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max().alias("gpu_end_ns"),
        )
    )
    if not gpu:
        g = g.with_columns(
            pl.lit(None, dtype=pl.Int64).alias("gpu_start_ns"), pl.lit(None, dtype=pl.Int64).alias("gpu_end_ns")
        )
    out = windows.join(g, on="iteration", how="left")
    return out.with_columns(
        pl.when(pl.col("gpu_start_ns").is_not_null())
        .then(pl.col("gpu_end_ns") - pl.col("gpu_start_ns"))
        .otherwise(pl.col("cpu_end_ns") - pl.col("cpu_start_ns"))
        .alias("dur_ns")
    ).sort("cpu_start_ns")

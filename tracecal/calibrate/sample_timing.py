"""Which of a cluster's samples a model learns from when several timing methods measured the same op
(docs/calibration.md#timing).

A trace's operator row holds what the op's kernels took on the GPU (its own profiler events on a
CPU). ``cuda_burst`` and ``profiler`` samples time that; ``cuda_events`` and ``perf_counter`` samples
time the call around it, launch latency and Python included, and read higher, by more the shorter
the call (docs/samples.md#timing). A model fitted on both learns a level that is neither, and steps
between the shapes each method covered. So a model learns one kind:

- where an op and direction has at least ``MIN_SAMPLES`` usable kernel-timed samples, its call-timed
  ones are *superseded*: left out of the fit and counted, as flagged samples are;
- otherwise every sample of it is used, whichever way it was timed.

Samples without a method (imported published samples, rows stored before the ``timing`` column)
count as call-timed. Every model says which methods its training samples were timed by
(``fitted_timing``): the calibrate report, its JSON and the model's ``meta.json`` carry it.
"""

from __future__ import annotations

import polars as pl

from tracecal.calibrate.validation import MIN_SAMPLES

KERNEL_TIMED = ("cuda_burst", "profiler")
"""Methods that time what a trace's operator rows hold (docs/samples.md#timing)."""

SUPERSEDED = "superseded"
"""Boolean column ``mark_superseded`` adds to a samples frame."""


def mark_superseded(samples: pl.DataFrame) -> pl.DataFrame:
    """``samples`` plus ``SUPERSEDED``: true on the call-timed rows of every (family, op, direction)
    that has at least ``MIN_SAMPLES`` usable kernel-timed rows, false elsewhere."""
    if "timing" not in samples.columns:
        return samples.with_columns(pl.lit(False).alias(SUPERSEDED))
    kernel = pl.col("timing").is_in(KERNEL_TIMED).fill_null(False)
    usable = pl.col("quality_flag").is_null() & (pl.col("median_ns") > 0).fill_null(False)
    enough = (kernel & usable).sum().over("family", "op", "direction") >= MIN_SAMPLES
    return samples.with_columns((enough & ~kernel).alias(SUPERSEDED))


def fitted_timing(rows: pl.DataFrame) -> str | None:
    """The timing methods of ``rows`` (a model's training samples), sorted and comma-joined
    (``cuda_burst``, ``cuda_burst, profiler``); None when no row records one."""
    if "timing" not in rows.columns:
        return None
    methods = sorted(m for m in rows.get_column("timing").drop_nulls().unique().to_list() if m)
    return ", ".join(methods) or None

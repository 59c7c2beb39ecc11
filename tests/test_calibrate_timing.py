"""A model learns one timing method: kernel-timed samples (cuda_burst, profiler) supersede the
call-timed ones (cuda_events, perf_counter) of the same op, and every model says what it was fitted on
(docs/calibration.md#timing). On the shared H200 samples (CUDA events), with a kernel-timed
re-measurement of the same layer-norm calls made from them."""

from __future__ import annotations

import polars as pl
from conftest import SHARED_DATA

from tracecal.calibrate.fitting import calibrate_samples, report_frame
from tracecal.calibrate.sample_timing import SUPERSEDED, fitted_timing, mark_superseded
from tracecal.calibrate.validation import MIN_SAMPLES
from tracecal.cli.calibrate import _timing_line
from tracecal.sql.samples import read_parquet_samples

SHARED = SHARED_DATA / "gpu" / "h200" / "samples" / "h200_samples.parquet"
KERNEL_LEVEL = 0.8
"""The kernel-timed copies read this share of the event-timed duration (events read launch gaps too)."""


def _samples() -> pl.DataFrame:
    frame = pl.from_arrow(read_parquet_samples(SHARED))
    assert isinstance(frame, pl.DataFrame)
    return frame


def _remeasured(events: pl.DataFrame, method: str, rows: int | None = None) -> pl.DataFrame:
    """``events`` (cuda_events rows) as if timed again by ``method``: new ids, kernel-level durations."""
    again = events.head(rows) if rows is not None else events
    return again.with_columns(
        (pl.col("sample_id") + f"-{method}").alias("sample_id"),
        pl.lit(method).alias("timing"),
        pl.col("median_ns") * KERNEL_LEVEL,
    )


def test_kernel_timed_samples_supersede_the_call_timed_ones_of_the_same_op() -> None:
    samples = _samples()
    assert set(samples["timing"].to_list()) == {"cuda_events"}
    norm = samples.filter(pl.col("op") == "aten::layer_norm")
    mixed = pl.concat([samples, _remeasured(norm.filter(pl.col("direction") == "fwd"), "cuda_burst")])
    marked = mark_superseded(mixed)
    superseded = marked.filter(pl.col(SUPERSEDED))
    # exactly the event-timed layer-norm forwards: the backward and every other op keep their samples
    assert superseded["timing"].unique().to_list() == ["cuda_events"]
    assert superseded.select("op", "direction").unique().rows() == [("aten::layer_norm", "fwd")]
    assert superseded.height == norm.filter(pl.col("direction") == "fwd").height
    # too few kernel-timed samples to fit on: the op keeps all of its samples
    few = pl.concat([samples, _remeasured(norm, "profiler", rows=MIN_SAMPLES - 1)])
    assert not mark_superseded(few)[SUPERSEDED].any()
    assert fitted_timing(marked.filter(~pl.col(SUPERSEDED) & (pl.col("op") == "aten::layer_norm"))) == (
        "cuda_burst, cuda_events"  # the backward is still event-timed: the fwd and bwd models differ
    )


def test_a_model_fitted_on_kernel_timed_samples_says_so_and_predicts_their_level() -> None:
    samples = _samples().filter(pl.col("family") == "norm")
    fwd = samples.filter(pl.col("direction") == "fwd")
    mixed = pl.concat([samples, _remeasured(fwd, "cuda_burst")])
    results = {r.key.direction: r for r in calibrate_samples(mixed, "h200", family="norm", n_jobs=1, folds=2)}
    kernel, events = results["fwd"], results["bwd"]
    assert (kernel.timing, kernel.n_superseded, kernel.n_train + kernel.n_test) == (
        "cuda_burst",
        fwd.height,
        fwd.height,
    )
    assert (events.timing, events.n_superseded) == ("cuda_events", 0)
    # the fit is at the kernel level, not between the two
    assert kernel.model is not None and kernel.training is not None
    from tracecal.calibrate.features import feature_frame

    predicted = kernel.model.predict(feature_frame(fwd, "norm"))
    ratio = (pl.Series(predicted) / fwd["median_ns"]).median()
    assert abs(ratio - KERNEL_LEVEL) < 0.05, ratio
    report = report_frame(list(results.values()))
    assert report.select("direction", "timing", "superseded").sort("direction").rows() == [
        ("bwd", "cuda_events", 0),
        ("fwd", "cuda_burst", fwd.height),
    ]
    line = _timing_line(report)
    assert line is not None and "1 on cuda_burst" in line and f"{fwd.height} call-timed samples superseded" in line

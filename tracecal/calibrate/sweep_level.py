"""A collective sweep's level around a size: what a traced collective is predicted at (pure).

A collective sweep times one message size after the other, so neighbouring samples share the state
of the network while they ran: other jobs' traffic, the peers' arrival skew, a protocol pattern that
repeats with the size. Its hold-out rows interleave with the training sizes, so the regressor chosen
on them follows the nearest sizes, and that shared state with them. A training run meets the network
at another time. So a traced collective is predicted at the sweep's *level* around its size:

    level(s) = baseline(s) · median{ y_i / baseline(s_i) : |log(s_i / s)| ≤ log(1 + LEVEL_WINDOW) }

with ``baseline`` the regressor's physical baseline (latency · steps + bus bytes / bandwidth), which
carries each neighbour to the traced size.

A point-to-point transfer is a rendezvous: the replay starts it when both ends have arrived and times
it at the shorter end (the other includes the wait), and a rebuilt decoded run keeps each p2p kernel's
shortest traced occurrence for the same reason. A p2p sample is the sender's kernel alone, its wait
for the receiver included (the published sampler runs without a barrier). So a send or receive is
predicted at the low end of its window (``TRANSFER_QUANTILE``) rather than its median.

A size with fewer than ``LEVEL_MIN_SAMPLES`` samples in its window (the ends of a sweep, sparse
sweeps) keeps the regressor's prediction. The regressor and its hold-out errors are unchanged; only
the prediction of traced collectives reads the level.
See docs/calibration.md#routing-a-row-to-a-model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracecal.calibrate.estimators import PhysicalBaseline
from tracecal.calibrate.features import COMM_FAMILY, feature_frame

LEVEL_WINDOW = 0.10
"""Samples within this relative distance in size of a traced collective make its level."""

LEVEL_MIN_SAMPLES = 5
"""Fewer samples than this in the window: the regressor's prediction stands."""

TRANSFER_QUANTILE = 0.1
"""The quantile of the window a point-to-point transfer is predicted at (a collective: the median)."""

POINT_TO_POINT = ("send", "recv")
"""Collectives that are one transfer between two ranks, predicted at ``TRANSFER_QUANTILE``."""


@dataclass(frozen=True)
class SweepLevel:
    """One sweep's samples as (log size, duration / baseline), sorted by size, and the quantile of a
    window that is its level (0.5: the median)."""

    log_sizes: np.ndarray
    ratios: np.ndarray
    quantile: float = 0.5

    @classmethod
    def of(cls, training: pl.DataFrame, baseline: PhysicalBaseline, collective: str | None = None) -> SweepLevel:
        """From a collective model's training rows (``size_bytes``, ``median_ns`` and the comm
        columns) and its fitted physical baseline; ``collective`` in ``POINT_TO_POINT`` takes the
        level at ``TRANSFER_QUANTILE``."""
        sizes = training.get_column("size_bytes").cast(pl.Float64).fill_null(np.nan).to_numpy()
        durations = training.get_column("median_ns").cast(pl.Float64).fill_null(np.nan).to_numpy()
        base = baseline.predict(feature_frame(training, COMM_FAMILY))
        keep = np.isfinite(sizes) & (sizes > 0) & np.isfinite(durations) & (durations > 0)
        order = np.argsort(sizes[keep], kind="stable")
        quantile = TRANSFER_QUANTILE if collective in POINT_TO_POINT else 0.5
        return cls(np.log(sizes[keep][order]), (durations[keep] / base[keep])[order], quantile)

    def ratio_at(self, sizes: np.ndarray) -> np.ndarray:
        """The ratio to the baseline of the samples around each size at ``quantile``; NaN where the window
        holds fewer than ``LEVEL_MIN_SAMPLES`` samples or the size is unknown."""
        out = np.full(len(sizes), np.nan)
        half = np.log1p(LEVEL_WINDOW)
        for size in np.unique(sizes[np.isfinite(sizes) & (sizes > 0)]):
            centre = np.log(size)
            lo = np.searchsorted(self.log_sizes, centre - half, side="left")
            hi = np.searchsorted(self.log_sizes, centre + half, side="right")
            if hi - lo >= LEVEL_MIN_SAMPLES:
                out[sizes == size] = float(np.quantile(self.ratios[lo:hi], self.quantile))
        return out

    def predict(self, features: pl.DataFrame, baseline: PhysicalBaseline, fallback: np.ndarray) -> np.ndarray:
        """Durations (ns) of the collective rows of ``features`` (a comm ``feature_frame``) at the
        sweep's level; ``fallback`` (the regressor's) where the window is too thin."""
        sizes = features.get_column("size_bytes").to_numpy()
        level = baseline.predict(features) * self.ratio_at(sizes)
        return np.where(np.isfinite(level), level, fallback)

"""A local-linear smoother along one key (log message size), its neighbourhood chosen by leave-one-out.

Why: a collective sweep is one-dimensional (duration against size at a fixed topology) and its noise is
not independent — neighbouring sizes were measured one after the other and share the network's state
(residuals of adjacent sizes correlate at 0.5–0.7 on most Perlmutter files). The best predictor of a
held-out size is then a fit through its nearest measured neighbours, with a neighbourhood as small as
the noise allows. A tree ensemble approximates that with piecewise constants; this fits a weighted
line through the ``k`` nearest training rows (tricube weights in key distance, as LOESS does), which
follows the local slope exactly — or, where the noise shared by neighbours outweighs the slope, a
Gaussian-weighted line or mean, or, where the noise is skewed (sporadic slow repeats), the
1/duration-weighted median of the neighbours moved along the local slope (``SHAPES``).

``k`` and the shape are chosen at fit time by leave-one-out over ``K_GRID`` × ``SHAPES``: every
training row is predicted from
its own nearest neighbours *without itself*, which is the situation of a held-out row at the density
of the training data (a k-fold inside the training rows would thin the neighbourhood and favour
too-large ``k``). The criterion is MAPE of ``exp(value)`` after its MAPE-optimal scale — the value
being a log duration ratio, so that is the error the calibration is scored on.

Outside the training keys the fit at the nearest end is held constant (clamped key): the smoother
only corrects a physical baseline, which carries the extrapolation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracecal.errors import CalibrationError

K_GRID = (2, 3, 4, 5, 6, 8, 10, 13, 16, 20, 25, 30, 40)
"""Neighbourhood sizes leave-one-out chooses from (2: the two adjacent sizes; 40: a wide smoother)."""


def _neighbours(keys: np.ndarray, queries: np.ndarray, k: int, exclude: np.ndarray | None) -> np.ndarray:
    """Positions (into sorted ``keys``) of the ``k`` nearest keys of every query, nearest first.

    ``exclude[i]`` is a position query ``i`` may not use (itself, for leave-one-out), or -1.
    """
    n = len(keys)
    at = np.searchsorted(keys, queries)
    # the k nearest of a sorted array lie within k (+1 for an excluded row) positions of the insertion point
    offsets = np.arange(-(k + 1), k + 2)
    window = np.clip(at[:, None] + offsets[None, :], 0, n - 1)
    distance = np.abs(keys[window] - queries[:, None])
    # clipping repeats the end positions: keep only the first copy of each
    repeated = np.zeros_like(window, dtype=bool)
    repeated[:, 1:] = window[:, 1:] == window[:, :-1]
    distance = np.where(repeated, np.inf, distance)
    if exclude is not None:
        distance = np.where(window == exclude[:, None], np.inf, distance)
    nearest = np.argsort(distance, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(window, nearest, axis=1)


KERNELS = {
    "tricube": lambda u: (1.0 - u**3) ** 3,
    "gaussian": lambda u: np.exp(-4.5 * u**2),
}
"""Weights by distance as a share of the neighbourhood's reach (0 at the query, 1 at the farthest
neighbour): tricube as in LOESS, or a Gaussian that keeps weight on the farthest neighbours."""

MEDIAN = "median"
"""The shape whose fit is the MAPE-optimal point of the neighbourhood: the median of the neighbours'
values weighted by ``exp(-value)`` (∝ 1/duration), each first moved to the query along the local
slope. Robust where a sweep has sporadic slow outliers (skewed noise), which pull a mean or a line."""

SLOPE_NEIGHBOURS = 10
"""The median shape's slope comes from at least this many neighbours (a slope through two is noise)."""

SHAPES = (("tricube", 1), ("gaussian", 1), ("gaussian", 0), (MEDIAN, 1))
"""(kernel, degree) pairs leave-one-out chooses from: local lines, a local weighted mean for sweeps
whose neighbouring noise outweighs their slope, and the weighted median for skewed noise."""


def _line(dx: np.ndarray, y: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares line per row of ``dx``/``y``: (value at dx = 0, slope)."""
    total = weight.sum(axis=1)
    mean_x = (weight * dx).sum(axis=1) / total
    mean_y = (weight * y).sum(axis=1) / total
    centred = dx - mean_x[:, None]
    var_x = (weight * centred**2).sum(axis=1)
    cov = (weight * centred * (y - mean_y[:, None])).sum(axis=1)
    # equal keys (repeated sizes) have no slope: their weighted mean is the fit
    slope = np.where(var_x > 1e-300, cov / np.where(var_x > 1e-300, var_x, 1.0), 0.0)
    return mean_y - slope * mean_x, slope


def weighted_median(values: np.ndarray) -> np.ndarray:
    """Per row, the median of ``values`` weighted by ``exp(-value)`` (the MAPE-optimal point)."""
    order = np.argsort(values, axis=1, kind="stable")
    ranked = np.take_along_axis(values, order, axis=1)
    weight = np.exp(-(ranked - ranked[:, :1]))  # relative to the row minimum: no overflow
    cumulative = np.cumsum(weight, axis=1)
    at = (cumulative < 0.5 * cumulative[:, -1:]).sum(axis=1)
    return ranked[np.arange(len(ranked)), at]


def _local_fit(
    keys: np.ndarray,
    values: np.ndarray,
    queries: np.ndarray,
    k: int,
    exclude: np.ndarray | None,
    kernel: str = "tricube",
    degree: int = 1,
) -> np.ndarray:
    """The local fit at each query from its ``k`` nearest rows (``exclude``: see ``_neighbours``):
    a kernel-weighted polynomial of degree 0 or 1, or (``MEDIAN``) the weighted median."""
    positions = _neighbours(keys, queries, k, exclude)
    dx = keys[positions] - queries[:, None]
    y = values[positions]
    if kernel == MEDIAN:
        wide_k = min(SLOPE_NEIGHBOURS, len(keys) - 1)  # n - 1: a leave-one-out row has no more
        wide = positions if k >= wide_k else _neighbours(keys, queries, wide_k, exclude)
        wide_dx = keys[wide] - queries[:, None]
        _, slope = _line(wide_dx, values[wide], np.ones_like(wide_dx))
        return weighted_median(y - slope[:, None] * dx if degree else y)
    reach = np.max(np.abs(dx), axis=1, keepdims=True) * 1.0001 + 1e-12
    weight = KERNELS[kernel](np.abs(dx) / reach)
    if degree == 0:
        return (weight * y).sum(axis=1) / weight.sum(axis=1)
    return _line(dx, y, weight)[0]


def leave_one_out(
    sorted_keys: np.ndarray, values: np.ndarray, k: int, kernel: str = "tricube", degree: int = 1
) -> np.ndarray:
    """Each row's local fit from its ``k`` nearest *other* rows (keys sorted ascending)."""
    return _local_fit(sorted_keys, values, sorted_keys, k, np.arange(len(sorted_keys)), kernel, degree)


def _ratio_mape(log_ratio: np.ndarray) -> float:
    """MAPE (%) of predictions ``exp(log_ratio)`` times the measured value, after the best scale."""
    ratio = np.exp(-log_ratio)  # measured / predicted
    weight = 1.0 / ratio
    order = np.argsort(ratio)
    cumulative = np.cumsum(weight[order])
    scale = ratio[order][np.searchsorted(cumulative, 0.5 * cumulative[-1])]
    return float(np.mean(np.abs(scale / ratio - 1.0)) * 100.0)


class LocalLinear:
    """Local regression of ``values`` on a scalar ``key`` over the ``k`` nearest rows.

    Args:
        k: neighbourhood size; None chooses it by leave-one-out from ``grid`` at fit time.
        grid: candidate sizes for the leave-one-out choice.
        shapes: (kernel, degree) pairs leave-one-out chooses from (``SHAPES``).

    Learned: ``keys_`` and ``values_`` (training rows sorted by key), ``k_``, ``kernel_`` and
    ``degree_`` (the fit used), ``loo_mape_`` (leave-one-out MAPE % of ``exp(value)`` per
    (kernel, degree, k) tried).
    """

    def __init__(
        self,
        k: int | None = None,
        grid: Sequence[int] = K_GRID,
        shapes: Sequence[tuple[str, int]] = SHAPES,
    ) -> None:
        self.k = k
        self.grid = tuple(grid)
        self.shapes = tuple(shapes)

    def fit(self, key: np.ndarray, values: np.ndarray) -> LocalLinear:
        for kernel, degree in self.shapes:
            if kernel not in (*KERNELS, MEDIAN) or degree not in (0, 1):
                raise CalibrationError(
                    f"unknown local shape ({kernel!r}, {degree!r}): kernel one of {', '.join((*KERNELS, MEDIAN))}, "
                    "degree 0 or 1"
                )
        if self.k is not None and self.k < 1:
            raise CalibrationError(f"a local smoother needs k >= 1 neighbours, not {self.k}")
        key = np.asarray(key, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64)
        keep = np.isfinite(key) & np.isfinite(values)
        if keep.sum() < 3:
            raise CalibrationError("a local-linear smoother needs at least 3 rows with a finite key and value")
        order = np.argsort(key[keep], kind="stable")
        self.keys_ = key[keep][order]
        self.values_ = values[keep][order]
        n = len(self.keys_)
        candidates = [self.k] if self.k is not None else [k for k in self.grid if k < n] or [n - 1]
        self.loo_mape_: dict[tuple[str, int, int], float] = {}
        for kernel, degree in self.shapes:
            for k in candidates:
                k = min(int(k), n - 1)
                fitted = leave_one_out(self.keys_, self.values_, k, kernel, degree)
                self.loo_mape_[(kernel, degree, k)] = _ratio_mape(fitted - self.values_)
        # ties go to the larger neighbourhood (smoother, less variance on unseen keys), then to the
        # earlier shape
        rank = {shape: i for i, shape in enumerate(self.shapes)}
        self.kernel_, self.degree_, self.k_ = min(
            self.loo_mape_, key=lambda c: (self.loo_mape_[c], -c[2], rank[(c[0], c[1])])
        )
        return self

    def predict(self, key: np.ndarray) -> np.ndarray:
        """The smoothed value at each key; NaN keys get NaN, keys outside the training range the
        value at the nearest end."""
        if not hasattr(self, "k_"):
            raise CalibrationError("LocalLinear is not fitted; call fit(key, values) first")
        key = np.asarray(key, dtype=np.float64)
        out = np.full(len(key), np.nan)
        finite = np.isfinite(key)
        if finite.any():
            query = np.clip(key[finite], self.keys_[0], self.keys_[-1])
            out[finite] = _local_fit(self.keys_, self.values_, query, self.k_, None, self.kernel_, self.degree_)
        return out

"""Quality flags: find implausible microbenchmark samples before they reach calibration.

The rules are documented in docs/samples.md#quality-flags.

``flag_samples(frame)`` is a pure transform over a frame with the ``samples`` columns: it sets
``quality_flag`` to ``"<reason>: <detail>"`` on implausible rows and leaves plausible ones NULL.
Rules, first match wins, each judged only against physics or the sample's own file/config — never
against known answers:

``invalid_duration``
    the duration is missing, NaN, infinite, or ≤ 0.
``below_floor``
    a collective over ≥ 2 ranks faster than physics allows: under ``MIN_COLLECTIVE_NS``, or an
    implied bus bandwidth (nccl-tests: algbw = size/time, × 2(n−1)/n for all_reduce, (n−1)/n for
    all_gather/reduce_scatter/all_to_all, 1 for broadcast/reduce/send/recv) above
    ``MAX_BUSBW_GBPS`` — more than any GPU interconnect sustains (NVLink 5: 900 GB/s per direction).
``bwd_faster_than_fwd``
    a GEMM or attention backward under ``MIN_BWD_FWD_RATIO`` × the forward of the same shape
    (same file/config): a backward computes two (GEMM) or 2.5 (attention) times the forward's
    flops with the same kind of kernels, so it cannot take half the forward's time.
``duplicate_disagrees``
    samples of the same op, direction and features from the same file/config whose durations
    spread more than ``DUPLICATE_FACTOR``×: with three or more, those that far from the median of
    the duplicates; with two, both (there is no telling which one is right).
``off_trend``
    more than ``TREND_FACTOR``× off the local trend of its own sweep: the sweep (same cluster,
    source, file, op, direction, and for collectives the same collective and topology) is sorted by
    work — size_bytes for collectives; flops, io_bytes, elements, params or tokens·hidden for compute
    — and each sample is compared with the median of its ``NEIGHBOURS`` nearest neighbours on each
    side, each shifted to the sample's work along the sweep's robust (Theil–Sen) log-log slope. Of
    the work measures a compute sweep has, the one its durations follow best (smallest median
    deviation from the trend) is used: GEMMs follow flops, memory-bound ops follow bytes.
    The deviation must also exceed ``ROBUST_SIGMAS`` robust standard deviations of the sweep's
    residuals, so a sweep that is noisy throughout is left to calibration to report. Sweeps shorter
    than ``MIN_SWEEP`` are not judged.

Flags whose reason is not one of these (e.g. set by a sampler) are kept as they are.
"""

from __future__ import annotations

import math

import duckdb
import numpy as np
import polars as pl

from tracecal.sql.samples import read_samples, write_samples

MIN_COLLECTIVE_NS = 1_000.0
"""No collective across two or more ranks completes faster than this: it is below NCCL's intra-node
latency."""

MAX_BUSBW_GBPS = 2_000.0
"""Implied bus bandwidth above this is a failed measurement, not a fast link (NVLink 5 is 900 GB/s
per direction, the fastest GPU interconnect shipping)."""

MIN_BWD_FWD_RATIO = 0.5
BWD_CHECKED_FAMILIES = ("gemm", "attention")
DUPLICATE_FACTOR = 4.0
TREND_FACTOR = 4.0
ROBUST_SIGMAS = 5.0
"""``off_trend`` also needs the deviation to exceed this many robust standard deviations
(1.4826 × median absolute residual) of the sweep: in a sweep that scatters widely everywhere, no
single sample is clearly junk, and calibration reports the noise instead."""
NEIGHBOURS = 10
MIN_SWEEP = 2 * NEIGHBOURS + 1

REASONS = ("invalid_duration", "below_floor", "bwd_faster_than_fwd", "duplicate_disagrees", "off_trend")
"""Reasons this module sets; ``flag_samples`` recomputes exactly these."""

_BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}

_SWEEP_KEYS = (
    "cluster",
    "source",
    "source_file",
    "op",
    "direction",
    "collective",
    "group_size",
    "nodes",
    "gpus_per_node",
    "dtype",
)
_FEATURE_KEYS = (
    "batch",
    "m",
    "n",
    "k",
    "heads",
    "seq_q",
    "seq_k",
    "head_dim",
    "causal",
    "elements",
    "tokens",
    "vocab",
    "hidden",
    "params",
    "tp",
    "size_bytes",
)


def busbw_factor(collective: str | None, ranks: int | None) -> float | None:
    """nccl-tests bus-bandwidth factor of a collective over ``ranks`` ranks; None if unknown."""
    if collective is None or ranks is None or ranks < 1:
        return None
    rule = _BUSBW_FACTOR.get(collective)
    return rule(ranks) if rule else 1.0


def _invalid(frame: pl.DataFrame) -> pl.Expr:
    d = pl.col("median_ns")
    return (
        pl.when(d.is_null() | d.is_nan())
        .then(pl.lit("invalid_duration: missing"))
        .when(d.is_infinite() | (d <= 0))
        .then(pl.format("invalid_duration: {} ns", d))
    )


def _below_floor(frame: pl.DataFrame) -> list[str | None]:
    out: list[str | None] = [None] * frame.height
    cols = frame.select("family", "collective", "group_size", "size_bytes", "median_ns").iter_rows()
    for i, (family, coll, ranks, size, dur) in enumerate(cols):
        if family != "comm" or ranks is None or ranks < 2 or dur is None or not dur > 0:
            continue
        if dur < MIN_COLLECTIVE_NS:
            out[i] = f"below_floor: {dur:.0f} ns < {MIN_COLLECTIVE_NS:.0f} ns for {ranks} ranks"
            continue
        factor = busbw_factor(coll, ranks)
        if size and factor:
            busbw = size / dur * factor  # bytes/ns = GB/s
            if busbw > MAX_BUSBW_GBPS:
                out[i] = f"below_floor: bus bandwidth {busbw:.0f} GB/s > {MAX_BUSBW_GBPS:.0f} GB/s"
    return out


def _bwd_faster(frame: pl.DataFrame, eligible: np.ndarray) -> list[str | None]:
    out: list[str | None] = [None] * frame.height
    keys = [c for c in (*_SWEEP_KEYS, *_FEATURE_KEYS) if c in frame.columns and c != "direction"]
    rows = frame.with_row_index("_i").filter(pl.Series(eligible) & pl.col("family").is_in(BWD_CHECKED_FAMILIES))
    fwd = rows.filter(pl.col("direction") == "fwd").group_by(keys).agg(pl.col("median_ns").median().alias("_fwd"))
    bwd = rows.filter(pl.col("direction") == "bwd").join(fwd, on=keys, how="inner", nulls_equal=True)
    for i, b, f in bwd.select("_i", "median_ns", "_fwd").iter_rows():
        if b < MIN_BWD_FWD_RATIO * f:
            out[i] = f"bwd_faster_than_fwd: backward {b / f:.2f}x the forward of the same shape"
    return out


def _duplicates(frame: pl.DataFrame, eligible: np.ndarray) -> list[str | None]:
    out: list[str | None] = [None] * frame.height
    keys = [c for c in (*_SWEEP_KEYS, *_FEATURE_KEYS) if c in frame.columns]
    groups = (
        frame.with_row_index("_i")
        .filter(pl.Series(eligible))
        .group_by(keys, maintain_order=True)
        .agg(pl.col("_i"), pl.col("median_ns"))
        .filter(pl.col("_i").list.len() > 1)
    )
    for idx, durs in groups.select("_i", "median_ns").iter_rows():
        d = np.asarray(durs, dtype=float)
        spread = d.max() / d.min()
        if spread <= DUPLICATE_FACTOR:
            continue
        if len(d) == 2:
            for i in idx:
                out[i] = f"duplicate_disagrees: {spread:.1f}x between 2 samples of the same shape"
            continue
        med = float(np.median(d))
        for i, v in zip(idx, d, strict=True):
            ratio = v / med
            if max(ratio, 1 / ratio) > DUPLICATE_FACTOR:
                out[i] = f"duplicate_disagrees: {ratio:.2g}x the median of {len(d)} samples of the same shape"
    return out


def theil_sen_slope(x: np.ndarray, y: np.ndarray, max_points: int = 200) -> float:
    """Median of pairwise slopes over (up to ``max_points`` evenly spaced) points with distinct x."""
    order = np.argsort(x, kind="stable")
    pick = order[np.linspace(0, len(order) - 1, min(len(order), max_points)).astype(int)]
    xs, ys = x[pick], y[pick]
    dx = xs[None, :] - xs[:, None]
    dy = ys[None, :] - ys[:, None]
    upper = np.triu(np.abs(dx) > 1e-9, 1)
    if not upper.any():
        return 0.0
    return float(np.median(dy[upper] / dx[upper]))


def trend_residuals(work: np.ndarray, duration: np.ndarray, neighbours: int = NEIGHBOURS) -> np.ndarray:
    """log(duration / local trend) of each point of one sweep (natural log; 0 = on the trend).

    The trend at a point is the median of its ``neighbours`` nearest points on each side (by work),
    each moved to the point's work along the sweep's Theil–Sen slope in log-log space (clipped to
    [0, 1.5]: more work never takes less time, and nothing grows much faster than linearly).
    """
    n = len(work)
    x, y = np.log(work), np.log(duration)
    slope = min(max(theil_sen_slope(x, y), 0.0), 1.5)
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    width = min(2 * neighbours, n - 1)
    start = np.clip(np.arange(n) - neighbours, 0, n - 1 - width)
    window = start[:, None] + np.arange(width + 1)[None, :]  # includes the point itself
    others = window[window != np.arange(n)[:, None]].reshape(n, width)
    shifted = ys[others] + slope * (xs[:, None] - xs[others])
    residual_sorted = ys - np.median(shifted, axis=1)
    residual = np.empty(n)
    residual[order] = residual_sorted
    return residual


def _work_candidates(frame: pl.DataFrame) -> list[np.ndarray]:
    """Work measures a sweep may follow: size for collectives; flops, io_bytes, elements, params and
    tokens·hidden for compute (NaN where a row lacks one)."""
    comm = frame["family"].to_numpy() == "comm"
    size = frame["size_bytes"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    compute = [
        frame.select(e.cast(pl.Float64)).to_series().fill_null(np.nan).to_numpy()
        for e in (
            pl.col("flops"),
            pl.col("io_bytes"),
            pl.col("elements"),
            pl.col("params"),
            pl.col("tokens") * pl.col("hidden"),
        )
    ]
    return [np.where(comm, size, np.nan)] + [np.where(comm, np.nan, c) for c in compute]


def _off_trend(frame: pl.DataFrame, eligible: np.ndarray) -> list[str | None]:
    """Per sweep, the work measure the durations follow best (smallest median |residual|) decides."""
    out: list[str | None] = [None] * frame.height
    candidates = _work_candidates(frame)
    keys = [c for c in _SWEEP_KEYS if c in frame.columns]
    sweeps = (
        frame.with_row_index("_i")
        .filter(pl.Series(eligible))
        .group_by(keys, maintain_order=True)
        .agg(pl.col("_i"))
        .filter(pl.col("_i").list.len() >= MIN_SWEEP)
    )
    dur = frame["median_ns"].to_numpy()
    limit = math.log(TREND_FACTOR)
    for (idx,) in sweeps.select("_i").iter_rows():
        idx = np.asarray(idx)
        best: np.ndarray | None = None
        for work in candidates:
            w = work[idx]
            if not (np.isfinite(w) & (w > 0)).all():
                continue
            residual = trend_residuals(w, dur[idx])
            if best is None or np.median(np.abs(residual)) < np.median(np.abs(best)):
                best = residual
        if best is None:
            continue
        sigma = 1.4826 * float(np.median(np.abs(best - np.median(best))))
        far = np.abs(best) > max(limit, ROBUST_SIGMAS * sigma)
        for i, r in zip(idx[far], best[far], strict=True):
            what = "slower" if r > 0 else "faster"
            out[int(i)] = f"off_trend: {math.exp(abs(r)):.1f}x {what} than its {2 * NEIGHBOURS} nearest neighbours"
    return out


def flag_samples(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (``samples`` columns) with ``quality_flag`` set by the rules of this module.

    Flags with reasons outside ``REASONS`` are kept; flags of these rules are recomputed, so the
    function is idempotent. Row order and every other column are unchanged.
    """
    if frame.height == 0:
        return frame
    existing = frame["quality_flag"]
    foreign = existing.str.split(":").list.first().is_in(list(REASONS)).not_() & existing.is_not_null()
    invalid = frame.select(_invalid(frame).alias("f")).to_series()
    flags: list[str | None] = invalid.to_list()
    valid = invalid.is_null().to_numpy() & ~foreign.to_numpy()
    for i, flag in enumerate(_below_floor(frame)):
        if flag and valid[i]:
            flags[i] = flag
    valid &= np.array([f is None for f in flags])
    for i, flag in enumerate(_bwd_faster(frame, valid)):
        if flag:
            flags[i] = flag
    valid &= np.array([f is None for f in flags])
    for i, flag in enumerate(_duplicates(frame, valid)):
        if flag:
            flags[i] = flag
    valid &= np.array([f is None for f in flags])
    for i, flag in enumerate(_off_trend(frame, valid)):
        if flag:
            flags[i] = flag
    merged = pl.Series("quality_flag", flags, dtype=pl.Utf8)
    result = pl.when(foreign).then(existing).otherwise(merged)
    return frame.with_columns(pl.select(result.alias("quality_flag")).to_series())


def flag_counts(frame: pl.DataFrame) -> dict[str, int]:
    """Flagged rows per reason (the part of ``quality_flag`` before the colon)."""
    reasons = frame["quality_flag"].drop_nulls().str.split(":").list.first()
    return dict(sorted(reasons.value_counts().iter_rows()))


def reflag_cluster(con: duckdb.DuckDBPyConnection, cluster: str) -> dict[str, int]:
    """Recompute the flags of all of ``cluster``'s stored samples together (a sampler run in parts
    only saw its own part); write back the rows whose flag changed. Returns flagged rows per reason.

    Raises:
        SampleError: the cluster has no samples.
    """
    frame = read_samples(con, cluster)
    flagged = flag_samples(frame)
    changed = flagged.filter(flagged["quality_flag"].ne_missing(frame["quality_flag"]))
    if changed.height:
        write_samples(con, changed.to_arrow(), origin=f"flags of cluster {cluster}")
    return flag_counts(flagged)

"""Hold-out protocols and error metrics.

Two protocols, both on samples whose ``quality_flag`` is NULL (flagged ones are excluded from training
and scoring alike, and counted):

- **published**: for samples imported from GPUModeling25, the exact split its tuning used —
  ``train_test_split(range(n_rows_of_the_file), test_size=0.2, random_state=42)`` over the rows of the
  source CSV in file order. The file row of a sample is recovered from its ``sample_id`` (the importer
  hashes file name and row index into it), so our hold-out rows are theirs and the errors compare.
- **own**: other samples get a seeded 80/20 split of their rows ordered by ``sample_id``.

Model choice only ever sees the training rows (k-fold CV inside them, ``selection``).

Metrics are absolute percentage errors, ``|pred − measured| / measured × 100``: MAPE, p50, p90, max.
For collectives, ``noise_level`` measures how well *any* smooth model of size could do: the hold-out
MAPE of the median of the nearest training samples in size. A sweep whose noise level exceeds
``CONSISTENT_NOISE_PCT`` is not self-consistent (e.g. duration per byte varying 20× at equal size) and
is reported as such instead of being presented as a fitted model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from tracecal.calibrate.estimators import import_sklearn
from tracecal.sql.samples import sample_id

HOLDOUT_FRACTION = 0.2
PUBLISHED_SEED = 42
MIN_SAMPLES = 12
"""A group with fewer usable samples says "too few samples" instead of fitting."""

CONSISTENT_NOISE_PCT = 5.0
"""Replicate-spread error above which a collective sweep is called inconsistent."""

NOISE_NEIGHBOURS = 5


@dataclass(frozen=True)
class Split:
    """Train and test row positions (into the usable rows of a group) and how they were chosen."""

    train: np.ndarray
    test: np.ndarray
    protocol: str  # "published" or "own"


def ape(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Absolute percentage errors, %."""
    return np.abs(np.asarray(predicted, float) - np.asarray(measured, float)) / np.asarray(measured, float) * 100.0


def error_metrics(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float | None]:
    """``mape``, ``p50_ape``, ``p90_ape``, ``max_ape`` (%) and ``n``; None values for no rows."""
    errors = ape(predicted, measured)
    if errors.size == 0:
        return {"mape": None, "p50_ape": None, "p90_ape": None, "max_ape": None, "n": 0}
    return {
        "mape": float(np.mean(errors)),
        "p50_ape": float(np.percentile(errors, 50)),
        "p90_ape": float(np.percentile(errors, 90)),
        "max_ape": float(np.max(errors)),
        "n": int(errors.size),
    }


def published_rows(group: pl.DataFrame, cluster: str) -> np.ndarray | None:
    """Each sample's row index in its published source file, or None when the group is not (all)
    imported from files whose every row is present (then the published split cannot be rebuilt).

    ``group`` holds every sample of the group *including flagged ones* (the split is over file rows).
    """
    needed = {"sample_id", "source", "source_file", "op", "direction"}
    if not needed <= set(group.columns) or group.height == 0:
        return None
    if group.get_column("source_file").null_count() or not all(
        s.startswith("imported:") for s in group.get_column("source").to_list()
    ):
        return None
    rows = np.full(group.height, -1, dtype=np.int64)
    position = {sid: i for i, sid in enumerate(group.get_column("sample_id").to_list())}
    keys = group.select("source", "source_file", "op", "direction").unique(maintain_order=True)
    for source, source_file, op, direction in keys.iter_rows():
        members = group.filter(
            (pl.col("source") == source)
            & (pl.col("source_file") == source_file)
            & (pl.col("op") == op)
            & (pl.col("direction") == direction)
        )
        for index in range(members.height):
            sid = sample_id(cluster, source, op, direction, {"file": source_file, "row": index})
            if sid not in position:
                return None
            rows[position[sid]] = index
    return rows if np.all(rows >= 0) else None


def holdout_split(group: pl.DataFrame, usable: np.ndarray, cluster: str) -> Split:
    """The hold-out split of a group's usable rows (``usable``: boolean mask over ``group``).

    Published when every sample's file row is known (one source file per group), else own.
    """
    positions = np.flatnonzero(usable)
    file_rows = published_rows(group, cluster)
    if file_rows is not None and group.get_column("source_file").n_unique() == 1:
        n_file = int(file_rows.max()) + 1
        _, test_rows = import_sklearn("sklearn.model_selection").train_test_split(
            np.arange(n_file), test_size=HOLDOUT_FRACTION, random_state=PUBLISHED_SEED
        )
        in_test = np.isin(file_rows[positions], test_rows)
        return Split(train=np.flatnonzero(~in_test), test=np.flatnonzero(in_test), protocol="published")
    order = np.argsort(group.get_column("sample_id").to_numpy()[positions], kind="stable")
    shuffled = order[np.random.default_rng(PUBLISHED_SEED).permutation(len(order))]
    n_test = max(1, round(HOLDOUT_FRACTION * len(order)))
    return Split(train=np.sort(shuffled[n_test:]), test=np.sort(shuffled[:n_test]), protocol="own")


def noise_level(size: np.ndarray, measured: np.ndarray, split: Split, neighbours: int = NOISE_NEIGHBOURS) -> float:
    """Hold-out MAPE (%) of the median of the ``neighbours`` training samples nearest in ``size``.

    What a perfect smooth model of size alone could reach given the replicate spread: nearly equal
    sizes should take nearly equal time, so a large value means the sweep contradicts itself.
    """
    train_size = size[split.train]
    order = np.argsort(train_size, kind="stable")
    lx, ly = np.log(train_size[order]), np.log(measured[split.train][order])
    predicted = np.empty(len(split.test))
    for i, x in enumerate(np.log(size[split.test])):
        at = int(np.searchsorted(lx, x))
        lo, hi = max(0, at - 2 * neighbours), min(len(lx), at + 2 * neighbours)
        window = np.arange(lo, hi)
        nearest = window[np.argsort(np.abs(lx[window] - x), kind="stable")[:neighbours]]
        # shift each neighbour to the test size along the local log-log trend, so a steep trend
        # between sparse samples is not mistaken for noise
        slope = np.polyfit(lx[window], ly[window], 1)[0] if np.ptp(lx[window]) > 0 else 0.0
        predicted[i] = np.exp(np.median(ly[nearest] + slope * (x - lx[nearest])))
    return float(np.mean(ape(predicted, measured[split.test])))


def published_comparison(report: pl.DataFrame) -> list[dict[str, Any]]:
    """Ours vs published over the hold-out ``report`` rows (``Calibration.report``) that have a
    published error, compute and comm separately: groups, how many of ours are lower, the medians.
    For collectives, ``consistent_*`` count only sweeps whose status is ok (noise level within
    ``CONSISTENT_NOISE_PCT``)."""
    out = []
    for scope, part in (
        ("compute", report.filter(pl.col("family") != "comm")),
        ("comm", report.filter(pl.col("family") == "comm")),
    ):
        both = part.filter(pl.col("published_mape").is_not_null() & pl.col("mape").is_not_null())
        if both.height == 0:
            continue
        wins = both.filter(pl.col("mape") < pl.col("published_mape")).height
        consistent = both.filter(pl.col("status") == "ok")
        out.append(
            {
                "scope": scope,
                "groups": both.height,
                "lower_than_published": wins,
                "share_lower": wins / both.height,
                "median_mape": float(both.get_column("mape").median()),  # type: ignore[arg-type]
                "median_published": float(both.get_column("published_mape").median()),  # type: ignore[arg-type]
                "consistent_groups": consistent.height,
                "consistent_max_mape": (
                    float(consistent.get_column("mape").max()) if consistent.height else None  # type: ignore[arg-type]
                ),
            }
        )
    return out

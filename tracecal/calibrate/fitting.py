"""Fit and validate one regressor per model group of a cluster's samples (pure: frames in, results out).

A model group is a family × direction × source op, and for collectives × topology (nodes × GPUs per
node): the unit the published system tuned, so its hold-out errors compare one to one. For every
group: exclude quality-flagged samples and those another timing method supersedes (``sample_timing``;
both counted), say "too few samples" below ``MIN_SAMPLES``, split
(published or own protocol, ``validation``), choose a model by k-fold CV on the training rows
(``selection``), score it once on the hold-out rows, measure the noise level of collective sweeps, and
refit the chosen configuration on every usable row for prediction.

Pooled NCCL samples (the published files without a topology suffix repeat the per-topology rows) are
left out whenever the same op has per-topology samples, so no row is counted twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from tracecal.calibrate.estimators import DurationRegressor, load_openmp_libraries
from tracecal.calibrate.features import (
    COMM_FAMILY,
    COMPUTE_FAMILIES,
    feature_frame,
    informative_phase,
    physics_columns,
    usable_features,
)
from tracecal.calibrate.sample_timing import SUPERSEDED, fitted_timing, mark_superseded
from tracecal.calibrate.selection import CANDIDATES, COMM_CANDIDATES, CV_ROWS, select_model
from tracecal.calibrate.validation import (
    CONSISTENT_NOISE_PCT,
    MIN_SAMPLES,
    error_metrics,
    holdout_split,
    noise_level,
)
from tracecal.schema import COMM_COLUMNS, SHAPE_COLUMNS

TRAINING_COLUMNS = (
    "sample_id", "family", "op", "direction", "collective",
    *(c.name for c in SHAPE_COLUMNS), *(c.name for c in COMM_COLUMNS), "median_ns", "timing",
)  # fmt: skip
"""The sample columns a stored model keeps as its training data (for refit-on-load and routing)."""


ALL_OPS = "*"
"""``GroupKey.op`` of a group that pools every op of its family (samples not imported per op)."""


@dataclass(frozen=True)
class GroupKey:
    """What a model serves: family, direction, source op and (collectives) topology ``"NxG"``."""

    family: str
    direction: str
    op: str
    topology: str | None = None

    @property
    def label(self) -> str:
        """The published name of the group: ``linear1``, or ``allreduce_2_4`` for a collective; the
        family (``gemm``) for a group pooling every sampled op of a family."""
        if self.op == ALL_OPS:
            return self.family if self.topology is None else f"{self.family}_{self.topology}"
        if self.topology is None:
            return self.op
        return f"{self.op}_{self.topology.replace('x', '_')}"


@dataclass
class GroupResult:
    """The outcome for one group: status, chosen model and its validation."""

    key: GroupKey
    status: str  # "ok", "inconsistent: ...", "too few samples: ..."
    n_train: int = 0
    n_test: int = 0
    n_excluded: int = 0
    n_superseded: int = 0
    timing: str | None = None
    protocol: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    cv_mape: float | None = None
    cv_scores: dict[str, float] = field(default_factory=dict)
    noise_ape: float | None = None
    published_mape: float | None = None
    params: dict[str, Any] | None = None
    model: DurationRegressor | None = None
    training: pl.DataFrame | None = None
    fingerprint: str | None = None

    @property
    def kind(self) -> str | None:
        return None if self.params is None else str(self.params["kind"])


def data_fingerprint(training: pl.DataFrame) -> str:
    """sha256 (24 hex digits) of the training samples' ids and durations, order-independent."""
    rows = training.select("sample_id", "median_ns").sort("sample_id")
    digest = hashlib.sha256()
    for sid, dur in rows.iter_rows():
        digest.update(f"{sid}:{dur!r};".encode())
    return digest.hexdigest()[:24]


def model_groups(samples: pl.DataFrame, family: str | None = None) -> list[tuple[GroupKey, pl.DataFrame]]:
    """Split a cluster's samples into model groups (sorted); families without a model are skipped."""
    frame = samples.filter(pl.col("family").is_in([*COMPUTE_FAMILIES, COMM_FAMILY]))
    if family is not None:
        frame = frame.filter(pl.col("family") == family)
    if "pooled" in frame.columns:
        split_ops = set(frame.filter(~pl.col("pooled").fill_null(False))["op"].to_list())
        frame = frame.filter(~(pl.col("pooled").fill_null(False) & pl.col("op").is_in(list(split_ops))))
    # imported published samples keep one group per source op (the unit the published errors are
    # for); sampled compute ops pool per family (aten::mm, aten::addmm, ... are one GEMM cost model,
    # the fallback for ops without samples of their own); collectives stay per collective
    imported = pl.col("source").fill_null("").str.starts_with("imported:")
    frame = frame.with_columns(
        pl.when(pl.col("family") == COMM_FAMILY)
        .then(pl.format("{}x{}", pl.col("nodes"), pl.col("gpus_per_node")))
        .otherwise(None)
        .alias("_topology"),
        pl.when(imported | (pl.col("family") == COMM_FAMILY))
        .then(pl.col("op"))
        .otherwise(pl.lit(ALL_OPS))
        .alias("_op"),
    )
    groups = []
    for (fam, direction, op, topology), rows in frame.group_by(
        ["family", "direction", "_op", "_topology"], maintain_order=True
    ):
        groups.append((GroupKey(str(fam), str(direction), str(op), topology), rows.drop("_topology", "_op")))
    # a sampled op with enough samples of its own also gets its own model: aten::gelu and aten::add
    # share a family but not a cost, and traced rows of that op are routed to it by name
    sampled = frame.filter(pl.col("_op") == ALL_OPS)
    if sampled.height:
        usable = pl.col("quality_flag").is_null() & (pl.col("median_ns") > 0)
        if SUPERSEDED in sampled.columns:
            usable = usable & ~pl.col(SUPERSEDED)
        counts = sampled.filter(usable).group_by("family", "direction", "op").len()
        for fam, direction, op, n in counts.iter_rows():
            total = sampled.filter((pl.col("family") == fam) & (pl.col("direction") == direction)).height
            if n >= MIN_SAMPLES and n < total:
                rows = sampled.filter(
                    (pl.col("family") == fam) & (pl.col("direction") == direction) & (pl.col("op") == op)
                )
                groups.append((GroupKey(str(fam), str(direction), str(op)), rows.drop("_topology", "_op")))
    return sorted(groups, key=lambda g: (g[0].family, g[0].op, g[0].topology or "", g[0].direction))


def published_lookup(published: pl.DataFrame | None) -> dict[tuple[str, str], float]:
    """``(label, direction) -> published MAPE %`` from ``published_errors``-shaped rows."""
    if published is None or published.height == 0:
        return {}
    out = {}
    for row in published.iter_rows(named=True):
        topology = row.get("topology")
        label = row["op"] if topology in (None, "pooled") else f"{row['op']}_{topology.replace('x', '_')}"
        if topology == "pooled":
            label = f"{row['op']}_pooled"
        out[(label, row["direction"])] = float(row["published_mape_pct"])
    return out


def fit_group(
    key: GroupKey,
    rows: pl.DataFrame,
    cluster: str,
    *,
    published_mape: float | None = None,
    folds: int = 3,
    n_jobs: int = 1,
) -> GroupResult:
    """Validate and fit one group. Never raises for data reasons: the status says what happened."""
    durations = rows.get_column("median_ns").cast(pl.Float64).fill_null(np.nan).to_numpy()
    flagged = rows.get_column("quality_flag").is_not_null().to_numpy() if "quality_flag" in rows.columns else 0
    superseded = np.zeros(rows.height, dtype=bool)
    if SUPERSEDED in rows.columns:
        superseded = rows.get_column(SUPERSEDED).fill_null(False).to_numpy().astype(bool)
    valid = ~np.asarray(flagged, dtype=bool) & np.isfinite(durations) & (durations > 0)
    usable = valid & ~superseded
    result = GroupResult(
        key=key,
        status="ok",
        n_excluded=int((~valid).sum()),
        n_superseded=int((valid & superseded).sum()),
        timing=fitted_timing(rows.filter(pl.Series(usable))),
        published_mape=published_mape,
    )
    n_usable = int(usable.sum())
    if n_usable < MIN_SAMPLES:
        result.status = f"too few samples: {n_usable} usable (need {MIN_SAMPLES})"
        return result

    split = holdout_split(rows, usable, cluster)
    data = rows.filter(pl.Series(usable))
    y = durations[usable]
    features = feature_frame(data, key.family)
    columns = usable_features(features[split.train])
    if "chunk_phase" in columns and not informative_phase(features[split.train], y[split.train]):
        columns.remove("chunk_phase")
    physical = physics_columns(key.family)
    selection = select_model(
        features[split.train],
        y[split.train],
        feature_columns=columns,
        physical_columns=physical,
        folds=folds,
        n_jobs=n_jobs,
        candidates=COMM_CANDIDATES if key.family == COMM_FAMILY else CANDIDATES,
    )
    holdout_model = DurationRegressor(**selection.params).fit(features[split.train], y[split.train])
    result.metrics = error_metrics(holdout_model.predict(features[split.test]), y[split.test])
    result.n_train, result.n_test = len(split.train), len(split.test)
    result.protocol = split.protocol
    result.cv_mape, result.cv_scores = selection.cv_mape, selection.scores
    result.params = selection.params

    if key.family == COMM_FAMILY:
        size = data.get_column("size_bytes").cast(pl.Float64).to_numpy()
        result.noise_ape = noise_level(size, y, split)
        if result.noise_ape > CONSISTENT_NOISE_PCT:
            result.status = (
                f"inconsistent: replicate spread alone gives {result.noise_ape:.1f} % hold-out error "
                f"(> {CONSISTENT_NOISE_PCT:g} %)"
            )

    # the stored model sees every usable row; its reported errors are the hold-out ones above
    result.model = DurationRegressor(**selection.params).fit(features, y)
    result.training = data.select([c for c in TRAINING_COLUMNS if c in data.columns])
    result.fingerprint = data_fingerprint(result.training)
    return result


WORKER_START_S = 3.0
"""CPU-seconds a spawned worker process takes before it can fit (interpreter, polars, scikit-learn
and XGBoost imports): about as many wall seconds when it has a core to itself. Measured with the
other constants below on the 2-core VM (benchmarks/RESULTS.md, calibration section)."""

GROUP_FIT_S = 0.8
"""Seconds one group's ``fit_group`` takes on one thread besides its rows' share."""

ROW_FIT_S = 0.003
"""Seconds ``fit_group`` takes on one thread per sample row of its group, up to ``CV_ROWS`` rows: the
model search, most of a group's time, sees no more."""


def fit_seconds(rows: int) -> float:
    """Estimated single-threaded seconds of ``fit_group`` on a group of ``rows`` sample rows."""
    return GROUP_FIT_S + ROW_FIT_S * min(rows, CV_ROWS)


def worker_processes(group_rows: Sequence[int], n_jobs: int) -> int:
    """How many worker processes fitting groups of these sizes (sample rows) pays for; 0 fits them in
    this process, one after another.

    ``min(n_jobs, groups)`` workers when they save more wall time than they add CPU time: the
    estimated time one by one (``fit_seconds`` of every group) less the time spread over the workers
    (the longer of the largest group and an even share) and their start-up must exceed the CPU-seconds
    of starting them (``WORKER_START_S`` each). A saving of a few seconds thus never takes every core
    of a shared machine (parallel tests, other calibrations) for it.
    """
    workers = min(n_jobs, len(group_rows))
    if workers < 2:
        return 0
    seconds = [fit_seconds(rows) for rows in group_rows]
    one_by_one = sum(seconds)
    spread = max(max(seconds), one_by_one / workers)
    saved = one_by_one - spread - WORKER_START_S
    return workers if saved > WORKER_START_S * workers else 0


def calibrate_samples(
    samples: pl.DataFrame,
    cluster: str,
    *,
    published: pl.DataFrame | None = None,
    family: str | None = None,
    folds: int = 3,
    n_jobs: int = 2,
    processes: bool | None = None,
    on_group: Callable[[GroupKey, int, int], None] | None = None,
) -> list[GroupResult]:
    """Fit and validate every model group of ``samples`` (rows of the ``samples`` table).

    Groups are independent, so when the work pays for starting them (``worker_processes``) they are
    fitted in ``n_jobs`` worker processes, each fitting single-threaded: most of a group's time is
    Python-level work per tree or per candidate (scikit-learn builds and clones every tree under the
    GIL), which threads inside one process cannot spread over the cores. Every fit is seeded, so the
    models and their predictions do not depend on where they were fitted.

    Args:
        samples: the cluster's samples, flagged ones included (they are counted as excluded), every
            timing method included (call-timed ones an op has kernel-timed samples enough to replace
            are counted as superseded: ``sample_timing``).
        cluster: the cluster name (part of imported samples' ids, for the published split).
        published: ``published_errors`` rows (op, direction, topology, published_mape_pct) to show
            next to ours; None when the samples are not the published ones.
        family: only this family.
        n_jobs: the most worker processes for the groups. Every estimator fits on one thread,
            wherever its group is fitted: a second thread made small groups slower and large ones no
            faster, and a threaded forest sums its trees' predictions in the order the threads finish.
        processes: True fits the groups in worker processes (``min(n_jobs, groups)``, at least one)
            and False in this process, whatever the work; None (default) lets ``worker_processes``
            decide from the groups' sizes.
        on_group: called with (key, groups done, total) as each group starts (one process) or
            finishes (worker processes), for progress display.

    Returns:
        One ``GroupResult`` per group, sorted by family, op, topology, direction.
    """
    lookup = published_lookup(published)
    groups = model_groups(mark_superseded(samples), family)
    load_openmp_libraries()  # before the workers' fitted models are unpickled here, which imports them
    if processes is None:
        workers = worker_processes([rows.height for _, rows in groups], n_jobs)
    else:
        workers = max(1, min(n_jobs, len(groups))) if processes and groups else 0
    if workers == 0:
        results = []
        for index, (key, rows) in enumerate(groups):
            if on_group is not None:
                on_group(key, index, len(groups))
            results.append(
                fit_group(
                    key,
                    rows,
                    cluster,
                    published_mape=lookup.get((key.label, key.direction)),
                    folds=folds,
                    n_jobs=1,
                )
            )
        return results
    return _fit_groups_in_processes(groups, cluster, lookup, folds, workers, on_group)


def _fit_groups_in_processes(
    groups: list[tuple[GroupKey, pl.DataFrame]],
    cluster: str,
    lookup: dict[tuple[str, str], float],
    folds: int,
    processes: int,
    on_group: Callable[[GroupKey, int, int], None] | None,
) -> list[GroupResult]:
    """``fit_group`` of every group in ``processes`` spawned workers (a forked child would inherit
    polars' and DuckDB's threads), largest groups first so the last one to finish is a small one;
    results in the groups' order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    order = sorted(range(len(groups)), key=lambda i: -groups[i][1].height)
    results: list[GroupResult | None] = [None] * len(groups)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        futures = {
            pool.submit(
                fit_group,
                groups[i][0],
                groups[i][1],
                cluster,
                published_mape=lookup.get((groups[i][0].label, groups[i][0].direction)),
                folds=folds,
                n_jobs=1,
            ): i
            for i in order
        }
        for done, future in enumerate(as_completed(futures), start=1):
            index = futures[future]
            results[index] = future.result()
            if on_group is not None:
                on_group(groups[index][0], done, len(groups))
    return [r for r in results if r is not None]


REPORT_SCHEMA = {
    "op": pl.Utf8, "direction": pl.Utf8, "family": pl.Utf8, "topology": pl.Utf8, "model": pl.Utf8,
    "n_train": pl.Int64, "n_test": pl.Int64, "excluded": pl.Int64, "mape": pl.Float64, "p50_ape": pl.Float64,
    "p90_ape": pl.Float64, "max_ape": pl.Float64, "cv_mape": pl.Float64, "published_mape": pl.Float64,
    "noise_ape": pl.Float64, "protocol": pl.Utf8, "status": pl.Utf8, "timing": pl.Utf8, "superseded": pl.Int64,
}  # fmt: skip
"""Columns of the hold-out report (``--report`` CSV): errors in %, ``published_mape`` empty when unknown."""


def report_frame(results: list[GroupResult]) -> pl.DataFrame:
    """One row per group (source op × direction, × topology for collectives) with its validation."""
    rows = []
    for r in results:
        rows.append(
            {
                "op": r.key.label,
                "direction": r.key.direction,
                "family": r.key.family,
                "topology": r.key.topology,
                "model": r.kind,
                "n_train": r.n_train,
                "n_test": r.n_test,
                "excluded": r.n_excluded,
                "mape": r.metrics.get("mape"),
                "p50_ape": r.metrics.get("p50_ape"),
                "p90_ape": r.metrics.get("p90_ape"),
                "max_ape": r.metrics.get("max_ape"),
                "cv_mape": r.cv_mape,
                "published_mape": r.published_mape,
                "noise_ape": r.noise_ape,
                "protocol": r.protocol,
                "status": r.status,
                "timing": r.timing,
                "superseded": r.n_superseded,
            }
        )
    return pl.DataFrame(rows, schema=REPORT_SCHEMA)

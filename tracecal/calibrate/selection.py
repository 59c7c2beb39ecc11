"""Bounded model selection by k-fold cross-validation on the training rows only.

Not the published exhaustive grids (1 647 configurations × 5 folds per op): a handful of candidates
that differ where it matters (physical baseline alone; forests with fine or smoothed leaves; shallow
or deep boosting; the blend of the best forest and booster; for collectives also the local smoother
and its blend with the best forest), scored by out-of-fold MAPE. The blends and the MAPE-optimal
``scale`` reuse the out-of-fold predictions, so they cost no extra fits. Seeds are fixed: the same
data gives the same choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from tracecal.calibrate.estimators import DurationRegressor

CANDIDATES: tuple[dict[str, Any], ...] = (
    {"kind": "physical"},
    {"kind": "random_forest", "min_samples_leaf": 1, "max_features": 0.6, "n_estimators": 60},
    {"kind": "random_forest", "min_samples_leaf": 4, "max_features": 0.6, "n_estimators": 60},
    {"kind": "xgboost", "xgb_depth": 6, "learning_rate": 0.08, "xgb_estimators": 250},
    {"kind": "xgboost", "xgb_depth": 3, "learning_rate": 0.15, "xgb_estimators": 150},
)
"""The bounded search space (the blend of the best forest and booster is added implicitly)."""

COMM_CANDIDATES: tuple[dict[str, Any], ...] = (
    {"kind": "physical"},
    {"kind": "random_forest", "min_samples_leaf": 1, "max_features": 1.0, "n_estimators": 150},
    {"kind": "random_forest", "min_samples_leaf": 3, "max_features": 1.0, "n_estimators": 150},
    {"kind": "xgboost", "xgb_depth": 4, "learning_rate": 0.08, "xgb_estimators": 200},
    {"kind": "local", "local_column": "log_bus_bytes"},
)
"""Collective sweeps are one-dimensional (size) and noisy: more trees average the noise away at little
cost, since the feature count is small; the local-linear smoother along log size (``local``) follows
the noise neighbouring sizes share (the blend of it and the best forest is added implicitly)."""

CV_ROWS = 1500
"""Model choice sees at most this many (seeded, random) training rows: the ranking of candidates is
stable well below that, and it bounds the search on the large published sweeps. The chosen model
is then fitted on every training row."""


def mape_scale(predicted: np.ndarray, measured: np.ndarray) -> float:
    """The factor c minimising mean |c·p − y| / y: the weighted median of y/p with weights p/y."""
    ratio = measured / predicted
    weight = predicted / measured
    order = np.argsort(ratio)
    cumulative = np.cumsum(weight[order])
    return float(ratio[order][np.searchsorted(cumulative, 0.5 * cumulative[-1])])


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured) * 100.0)


def kfold_indices(n: int, folds: int, seed: int) -> list[np.ndarray]:
    """Shuffled fold assignment (like sklearn ``KFold(shuffle=True, random_state=seed)``)."""
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(part) for part in np.array_split(order, folds)]


@dataclass
class Selection:
    """The chosen hyper-parameters and how every candidate scored (out-of-fold MAPE, %)."""

    params: dict[str, Any]
    cv_mape: float
    folds: int
    scores: dict[str, float] = field(default_factory=dict)
    oof_prediction: np.ndarray | None = None
    """Out-of-fold predictions of the winner (on the CV rows, at most ``CV_ROWS``)."""


def _label(params: dict[str, Any]) -> str:
    kind = params["kind"]
    if kind == "random_forest":
        return f"random_forest(leaf={params.get('min_samples_leaf')})"
    if kind == "xgboost":
        return f"xgboost(depth={params.get('xgb_depth')})"
    if kind == "local" and params.get("local_k") is not None:
        return f"local(k={params['local_k']})"
    return kind


def select_model(
    features: pl.DataFrame,
    durations_ns: np.ndarray,
    *,
    feature_columns: Sequence[str],
    physical_columns: Sequence[str],
    folds: int = 3,
    seed: int = 42,
    candidates: Sequence[dict[str, Any]] = CANDIDATES,
    n_jobs: int = 1,
) -> Selection:
    """Choose a ``DurationRegressor`` configuration by k-fold CV on these (training) rows only.

    Args:
        features: ``feature_frame`` of the training rows.
        durations_ns: measured durations of the same rows.
        feature_columns / physical_columns: passed to every candidate.
        folds: k of the k-fold (3 keeps a per-cluster calibration within minutes on 2 cores).
        seed: fold shuffling and estimator seed.
        n_jobs: threads of every candidate's estimators (one: on these data sizes a second thread
            made the search slower, not faster).

    Returns:
        ``Selection`` whose ``params`` construct the winner (``DurationRegressor(**params)``),
        including the cross-validated ``scale``.
    """
    y = np.asarray(durations_ns, dtype=np.float64)
    if len(y) > CV_ROWS:
        keep = np.sort(np.random.default_rng(seed).choice(len(y), CV_ROWS, replace=False))
        features, y = features[keep], y[keep]
    parts = kfold_indices(len(y), folds, seed)
    base = {"features": list(feature_columns), "physical_columns": list(physical_columns),
            "random_state": seed, "n_jobs": n_jobs}  # fmt: skip
    oof: dict[str, np.ndarray] = {}
    params_by_label: dict[str, dict[str, Any]] = {}
    for candidate in candidates:
        params = {**base, **candidate}
        if params["kind"] != "physical" and not feature_columns:
            continue
        if params["kind"] == "local" and params.get("local_column", "log_bus_bytes") not in feature_columns:
            continue  # no usable key (all missing or one size): nothing to smooth along
        label = _label(params)
        prediction = np.empty(len(y))
        for test in parts:
            train = np.setdiff1d(np.arange(len(y)), test, assume_unique=True)
            model = DurationRegressor(**params).fit(features[train], y[train])
            prediction[test] = model.predict(features[test])
        oof[label] = prediction
        params_by_label[label] = params

    forests = [k for k in oof if k.startswith("random_forest")]
    boosters = [k for k in oof if k.startswith("xgboost")]
    if forests and boosters:
        best_forest = min(forests, key=lambda k: _mape(oof[k], y))
        best_booster = min(boosters, key=lambda k: _mape(oof[k], y))
        # the blend is the geometric mean in prediction space, as DurationRegressor(kind="blend") does
        oof["blend"] = np.sqrt(oof[best_forest] * oof[best_booster])
        forest_params = params_by_label[best_forest]
        booster_params = params_by_label[best_booster]
        params_by_label["blend"] = {
            **forest_params,
            **{
                k: v
                for k, v in booster_params.items()
                if k.startswith(("xgb_", "learning", "subsample", "colsample", "min_child"))
            },
            "kind": "blend",
        }

    if forests and "local" in oof:
        best_forest = min(forests, key=lambda k: _mape(oof[k], y))
        oof["local_forest"] = np.sqrt(oof["local"] * oof[best_forest])
        params_by_label["local_forest"] = {
            **params_by_label[best_forest],
            **{k: v for k, v in params_by_label["local"].items() if k.startswith("local_")},
            "kind": "local_forest",
        }

    scores: dict[str, float] = {}
    scaled: dict[str, tuple[float, np.ndarray]] = {}
    for label, prediction in oof.items():
        scale = mape_scale(prediction, y)
        scaled[label] = (scale, prediction * scale)
        scores[label] = _mape(prediction * scale, y)
    winner = min(scores, key=lambda k: (scores[k], k))
    params = {**params_by_label[winner], "scale": scaled[winner][0]}
    return Selection(
        params=params, cv_mape=scores[winner], folds=folds, scores=scores, oof_prediction=scaled[winner][1]
    )

"""Duration regressors: a physical baseline, and tree ensembles or a local smoother on its log residual.

Both follow scikit-learn's estimator contract (``__init__`` stores hyper-parameters only, ``fit``
returns ``self``, learned state ends in ``_``, ``predict`` checks it is fitted), take a polars frame of
``features.feature_frame`` columns and durations in nanoseconds, and predict nanoseconds.

Why a residual: the baseline (roofline-style ``a + flops/peak + bytes/bandwidth`` for compute,
``latency·steps + bus_bytes/bandwidth`` for collectives) carries the scale and extrapolates sensibly;
the trees only learn ``log(duration / baseline)``, a small, bounded correction (wave quantisation,
kernel switches, protocol changes). Fitting on a log scale makes the squared loss a relative one,
which is what MAPE scores. ``scale`` is a final multiplicative factor chosen by cross-validation
(``selection``): the MAPE-optimal prediction of a noisy duration sits below its median. For
one-dimensional sweeps (a collective's sizes) the residual can instead be smoothed along log size
(``local.LocalLinear``), whose neighbourhood follows noise that neighbouring sizes share.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import polars as pl

from tracecal.errors import CalibrationError

MODEL_KINDS = ("physical", "random_forest", "xgboost", "blend", "local", "local_forest")
"""``blend`` is the geometric mean of the random forest and the XGBoost residual models; ``local`` a
local-linear smoother of the residual along one key column (``local.LocalLinear``, for one-dimensional
sweeps such as a collective's sizes); ``local_forest`` the geometric mean of ``local`` and the forest."""


OPENMP_WAIT_POLICY = "PASSIVE"
"""The OpenMP wait policy scikit-learn and XGBoost are loaded with unless the user set one."""


@cache
def load_openmp_libraries() -> None:
    """Load scikit-learn and XGBoost with OpenMP workers that sleep when idle.

    Both load one OpenMP runtime (libgomp), which reads ``OMP_WAIT_POLICY`` once, when it loads. Left
    unset, idle workers busy-wait between parallel regions; on a shared 2-core machine that turned a
    0.4 s boosting fit into 30 s. Unless the user chose a policy, ``OPENMP_WAIT_POLICY`` is in the
    environment during the load only, so the process's environment is as it was afterwards (and
    importing tracecal changes nothing). A process that loaded either library before keeps the
    policy it loaded them with. Every import of the two goes through ``import_sklearn`` and
    ``import_xgboost``, which call this first (worker processes of a fit included).
    """
    chosen = "OMP_WAIT_POLICY" in os.environ
    if not chosen:
        os.environ["OMP_WAIT_POLICY"] = OPENMP_WAIT_POLICY
    try:
        import sklearn  # noqa: F401  (loads the runtime)
        import xgboost  # noqa: F401
    finally:
        if not chosen:
            del os.environ["OMP_WAIT_POLICY"]


def import_xgboost() -> Any:
    """``xgboost``, loaded by ``load_openmp_libraries``."""
    load_openmp_libraries()
    import xgboost

    return xgboost


def import_sklearn(module: str) -> Any:
    """The scikit-learn module named ``module`` (e.g. ``"sklearn.ensemble"``), loaded by
    ``load_openmp_libraries``."""
    load_openmp_libraries()
    return importlib.import_module(module)


def _check_fitted(estimator: Any, attribute: str) -> None:
    if not hasattr(estimator, attribute):
        raise CalibrationError(f"{type(estimator).__name__} is not fitted; call fit(features, durations) first")


def _matrix(features: pl.DataFrame, columns: Sequence[str]) -> np.ndarray:
    missing = [c for c in columns if c not in features.columns]
    if missing:
        raise CalibrationError(f"feature frame lacks columns {missing}; build it with features.feature_frame")
    return features.select(list(columns)).to_numpy().astype(np.float64)


class PhysicalBaseline:
    """``duration ≈ c0 + Σ c_i · x_i`` with non-negative coefficients, fitted for relative error.

    Args:
        columns: feature columns the duration is linear in (``features.physics_columns(family)``),
            e.g. flops and bytes moved (so ``1/c_flops`` is an effective peak and ``1/c_bytes`` an
            effective bandwidth) or ring steps and bus bytes for a collective.

    Learned: ``coef_`` (intercept first, ns and ns per unit), ``n_features_in_``.
    """

    def __init__(self, columns: Sequence[str] = ("flops_derived", "bytes_moved")) -> None:
        self.columns = tuple(columns)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {"columns": self.columns}

    def _design(self, features: pl.DataFrame) -> np.ndarray:
        x = _matrix(features, self.columns)
        x = np.where(np.isfinite(x), x, 0.0)  # a missing physics term contributes nothing
        return np.column_stack([np.ones(len(x)), x])

    def fit(self, features: pl.DataFrame, durations_ns: np.ndarray) -> PhysicalBaseline:
        from scipy.optimize import nnls

        y = np.asarray(durations_ns, dtype=np.float64)
        if len(y) == 0 or np.any(~np.isfinite(y)) or np.any(y <= 0):
            raise CalibrationError("durations must be positive and finite to fit a physical baseline")
        design = self._design(features)
        # scale columns to unit max so NNLS is well conditioned, then weight rows by 1/y: the
        # least-squares problem becomes one in relative error
        norm = np.max(np.abs(design), axis=0)
        norm[norm == 0] = 1.0
        coef, _ = nnls(design / norm / y[:, None], np.ones(len(y)), maxiter=50 * design.shape[1])
        self.coef_ = coef / norm
        self.n_features_in_ = len(self.columns)
        return self

    def predict(self, features: pl.DataFrame) -> np.ndarray:
        _check_fitted(self, "coef_")
        prediction = self._design(features) @ self.coef_
        # never predict a non-positive duration: the residual models divide by it
        floor = max(float(self.coef_[0]), 1.0)
        return np.maximum(prediction, floor)


class DurationRegressor:
    """Predict an operator's duration (ns) from its features.

    Args:
        kind: ``physical`` (the baseline alone), ``random_forest``, ``xgboost``, ``blend``, ``local``
            or ``local_forest`` (see ``MODEL_KINDS``).
        features: feature columns the trees use (``features.usable_features`` of the training frame).
        physical_columns: columns of the baseline (see ``PhysicalBaseline``).
        n_estimators, max_depth, min_samples_leaf, max_features: random-forest hyper-parameters.
        xgb_estimators, xgb_depth, learning_rate, subsample, colsample_bytree, min_child_weight:
            XGBoost hyper-parameters.
        local_column: the key of the ``local`` smoother (a feature column, e.g. ``log_bus_bytes``).
        local_k: its neighbourhood size; None lets leave-one-out choose it at fit time.
        scale: multiplicative factor applied to the prediction (chosen by cross-validation).
        random_state: seed of both ensembles (fixed for reproducibility).
        n_jobs: threads for fitting and prediction (does not change results).

    Learned: ``baseline_`` (a fitted PhysicalBaseline), ``forest_`` (sklearn RandomForestRegressor,
    for random_forest/blend/local_forest), ``booster_`` (xgboost.XGBRegressor, for xgboost/blend),
    ``local_`` (``local.LocalLinear``, for local/local_forest), ``n_features_in_``.
    """

    def __init__(
        self,
        kind: str = "random_forest",
        features: Sequence[str] = (),
        physical_columns: Sequence[str] = ("flops_derived", "bytes_moved"),
        n_estimators: int = 100,
        max_depth: int | None = None,
        min_samples_leaf: int = 1,
        max_features: float = 0.6,
        xgb_estimators: int = 400,
        xgb_depth: int = 6,
        learning_rate: float = 0.05,
        subsample: float = 0.8,
        colsample_bytree: float = 0.8,
        min_child_weight: float = 1.0,
        local_column: str = "log_bus_bytes",
        local_k: int | None = None,
        scale: float = 1.0,
        random_state: int = 42,
        n_jobs: int = 2,
    ) -> None:
        self.kind = kind
        self.features = tuple(features)
        self.physical_columns = tuple(physical_columns)
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.max_features = max_features
        self.xgb_estimators = xgb_estimators
        self.xgb_depth = xgb_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.local_column = local_column
        self.local_k = local_k
        self.scale = scale
        self.random_state = random_state
        self.n_jobs = n_jobs

    _PARAMS = (
        "kind", "features", "physical_columns", "n_estimators", "max_depth", "min_samples_leaf",
        "max_features", "xgb_estimators", "xgb_depth", "learning_rate", "subsample", "colsample_bytree",
        "min_child_weight", "local_column", "local_k", "scale", "random_state", "n_jobs",
    )  # fmt: skip

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Hyper-parameters as a JSON-serialisable dict (tuples become lists)."""
        out = {}
        for name in self._PARAMS:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    def set_params(self, **params: Any) -> DurationRegressor:
        for name, value in params.items():
            if name not in self._PARAMS:
                raise CalibrationError(f"unknown hyper-parameter {name!r} for DurationRegressor")
            setattr(self, name, tuple(value) if isinstance(value, list) else value)
        return self

    def _uses_forest(self) -> bool:
        return self.kind in ("random_forest", "blend", "local_forest")

    def _uses_local(self) -> bool:
        return self.kind in ("local", "local_forest")

    def fit_local(self, features: pl.DataFrame, residual: np.ndarray, chosen: dict[str, Any] | None = None) -> None:
        """Fit ``local_`` on the residual along ``local_column``. The store's refit passes the stored
        leave-one-out choice as ``chosen`` (``k``, ``kernel``, ``degree``) instead of searching again."""
        from tracecal.calibrate.local import LocalLinear

        key = _matrix(features, [self.local_column])[:, 0]
        if chosen is None:
            self.local_ = LocalLinear(k=self.local_k).fit(key, residual)
        else:
            shape = (str(chosen["kernel"]), int(chosen["degree"]))
            self.local_ = LocalLinear(k=int(chosen["k"]), shapes=[shape]).fit(key, residual)

    def _uses_booster(self) -> bool:
        return self.kind in ("xgboost", "blend")

    def fit(self, features: pl.DataFrame, durations_ns: np.ndarray) -> DurationRegressor:
        y = np.asarray(durations_ns, dtype=np.float64)
        return self.fit_on_baseline(PhysicalBaseline(self.physical_columns).fit(features, y), features, y)

    def artifact_state(self) -> dict[str, Any]:
        """What a fitted regressor's artifact keeps besides its hyper-parameters, training rows and
        booster, for ``from_artifact``: the features, the baseline's columns and coefficients, and the
        smoother's leave-one-out choice (``k``, ``kernel``, ``degree``; None without a smoother)."""
        _check_fitted(self, "baseline_")
        return {
            "features": list(self.features),
            "physical_columns": list(self.physical_columns),
            "baseline_coef": [float(c) for c in self.baseline_.coef_],
            "local": (
                {"k": int(self.local_.k_), "kernel": self.local_.kernel_, "degree": int(self.local_.degree_)}
                if hasattr(self, "local_")
                else None
            ),
        }

    @classmethod
    def from_artifact(
        cls,
        hyperparams: dict[str, Any],
        state: dict[str, Any],
        features: pl.DataFrame,
        durations_ns: np.ndarray,
        booster: Any = None,
    ) -> DurationRegressor:
        """The fitted regressor an artifact describes: the one way a stored model is loaded.

        ``hyperparams`` as ``get_params`` gave them, ``state`` as ``artifact_state`` gave it, the
        training rows' ``features`` and durations, and for the boosted kinds the saved ``booster``. The
        baseline and booster are kept as saved; the forest and smoother are refitted on the same rows
        (seeded, and the smoother takes its stored choice without a search), so the result is the
        regressor that was stored.

        Raises:
            CalibrationError: the hyper-parameters or state do not fit this version, or the refit fails.
        """
        try:
            model = cls(**hyperparams)
            baseline = PhysicalBaseline(state["physical_columns"])
            baseline.coef_ = np.asarray(state["baseline_coef"], dtype=np.float64)
            baseline.n_features_in_ = len(baseline.columns)
            return model.fit_on_baseline(baseline, features, durations_ns, local=state.get("local"), booster=booster)
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"the stored regressor does not fit this tracecal ({exc!r})") from exc

    def fit_on_baseline(
        self,
        baseline: PhysicalBaseline,
        features: pl.DataFrame,
        durations_ns: np.ndarray,
        *,
        local: dict[str, Any] | None = None,
        booster: Any = None,
    ) -> DurationRegressor:
        """Fit the residual models of this kind on top of a fitted ``baseline``: ``fit``'s steps after
        the baseline. ``from_artifact`` passes what an artifact keeps: the baseline and ``booster`` as
        saved (kept, not fitted) and the smoother's stored choice ``local`` (no search)."""
        y = np.asarray(durations_ns, dtype=np.float64)
        if self.kind not in MODEL_KINDS:
            raise CalibrationError(f"unknown model kind {self.kind!r}; expected one of {', '.join(MODEL_KINDS)}")
        self.baseline_ = baseline
        self.n_features_in_ = len(self.features)
        if self.kind == "physical":
            return self
        if not self.features:
            raise CalibrationError("DurationRegressor needs feature columns for its trees (features=...)")
        x = _matrix(features, self.features)
        residual = np.log(y / baseline.predict(features))
        if self._uses_local():
            self.fit_local(features, residual, chosen=local)
        if self._uses_forest():
            self.forest_ = (
                import_sklearn("sklearn.ensemble")
                .RandomForestRegressor(
                    n_estimators=self.n_estimators,
                    max_depth=self.max_depth,
                    min_samples_leaf=self.min_samples_leaf,
                    max_features=self.max_features,
                    random_state=self.random_state,
                    n_jobs=self.n_jobs,
                )
                .fit(x, residual)
            )
        if self._uses_booster() and booster is not None:
            self.booster_ = booster
        elif self._uses_booster():
            self.booster_ = (
                import_xgboost()
                .XGBRegressor(
                    n_estimators=self.xgb_estimators,
                    max_depth=self.xgb_depth,
                    learning_rate=self.learning_rate,
                    subsample=self.subsample,
                    colsample_bytree=self.colsample_bytree,
                    min_child_weight=self.min_child_weight,
                    random_state=self.random_state,
                    n_jobs=self.n_jobs,
                    tree_method="hist",
                )
                .fit(x, residual)
            )
        return self

    def log_residual(self, features: pl.DataFrame) -> np.ndarray:
        """The trees' correction ``log(prediction / baseline)`` before ``scale`` (0 for physical)."""
        _check_fitted(self, "baseline_")
        if self.kind == "physical":
            return np.zeros(features.height)
        x = _matrix(features, self.features)
        parts = []
        if self._uses_local():
            _check_fitted(self, "local_")
            # a row without the key gets the baseline alone (no correction), as a tree falls back to
            # its default branch
            parts.append(np.nan_to_num(self.local_.predict(_matrix(features, [self.local_column])[:, 0]), nan=0.0))
        if self._uses_forest():
            _check_fitted(self, "forest_")
            parts.append(self.forest_.predict(x))
        if self._uses_booster():
            _check_fitted(self, "booster_")
            parts.append(self.booster_.predict(x).astype(np.float64))
        return np.mean(parts, axis=0)

    def predict(self, features: pl.DataFrame) -> np.ndarray:
        """Durations in ns, one per row of ``features`` (a ``feature_frame`` with ``self.features``)."""
        _check_fitted(self, "baseline_")
        if features.height == 0:
            return np.zeros(0)
        return self.scale * self.baseline_.predict(features) * np.exp(self.log_residual(features))

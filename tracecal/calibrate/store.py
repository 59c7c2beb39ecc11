"""The model store: versioned artifacts next to the database, rows in the ``models`` table.

One directory per model under ``config.model_store_dir(db) / <cluster> / <model_id>``:

- ``meta.json`` — cluster, family, direction, op, topology, model kind, hyper-parameters, features,
  the physical baseline's coefficients, the local smoother's leave-one-out choice (k, kernel,
  degree), training-data fingerprint, sha256 of ``training.parquet`` and ``booster.ubj``,
  validation metrics, library versions, and check predictions on a few training rows;
- ``booster.ubj`` — the XGBoost model in XGBoost's own format (xgboost/blend kinds);
- ``training.parquet`` — the training samples' shape columns and durations.

No pickle: a stored regressor is rebuilt by ``DurationRegressor.from_artifact``, the one loader
(scikit-learn forests and local smoothers refitted from the stored hyper-parameters and training
data, seeded or deterministic, so the refit is the same model), lazily: only when a row is routed to
it. Loading checks the artifact schema, the metadata's keys, library versions, that
``training.parquet`` and ``booster.ubj`` are the files written at calibration (sha256; the check
predictions alone would miss an edited row far from the few they cover) and that the rebuilt model
reproduces the check predictions; anything else raises
``CalibrationError`` telling the user to recalibrate.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl

from tracecal import __version__
from tracecal.calibrate.estimators import DurationRegressor, import_sklearn, import_xgboost
from tracecal.calibrate.features import feature_frame
from tracecal.calibrate.fitting import GroupKey, GroupResult, data_fingerprint
from tracecal.errors import CalibrationError
from tracecal.schema import MODELS, polars_schema
from tracecal.sql.connection import replace_rows

ARTIFACT_SCHEMA = 1
"""Bumped when the artifact layout changes; artifacts of another version must be recalibrated."""

CHECK_ROWS = 8
CHECK_RTOL = 1e-6

REQUIRED_META = (
    "cluster", "family", "direction", "op", "topology", "model_kind", "hyperparams", "features",
    "physical_columns", "baseline_coef", "versions", "check",
)  # fmt: skip
"""Keys every ``meta.json`` has; an artifact without one of them is refused (recalibrate)."""


def library_versions() -> dict[str, str]:
    """Versions of the libraries a stored model depends on."""
    return {
        "tracecal": __version__,
        "xgboost": import_xgboost().__version__,
        "scikit-learn": import_sklearn("sklearn").__version__,
        "numpy": np.__version__,
        "polars": pl.__version__,
    }


def model_id(cluster: str, key: GroupKey) -> str:
    """A filesystem-safe, stable artifact id: cluster, family, op label and direction."""
    raw = f"{cluster}-{key.family}-{key.label}-{key.direction}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)


def _write_artifact(directory: Path, cluster: str, result: GroupResult, created_at: datetime) -> dict[str, Any]:
    model = result.model
    assert model is not None and result.training is not None and result.params is not None
    directory.mkdir(parents=True, exist_ok=True)
    result.training.write_parquet(directory / "training.parquet")
    # the refit reads every training row, the check predictions only a few: a hash of the file
    # catches an edited row the check would not
    training_sha256 = hashlib.sha256((directory / "training.parquet").read_bytes()).hexdigest()
    booster_sha256 = None
    if hasattr(model, "booster_"):
        model.booster_.save_model(str(directory / "booster.ubj"))
        booster_sha256 = hashlib.sha256((directory / "booster.ubj").read_bytes()).hexdigest()
    check = result.training.head(CHECK_ROWS)
    meta = {
        "artifact_schema": ARTIFACT_SCHEMA,
        "cluster": cluster,
        "family": result.key.family,
        "direction": result.key.direction,
        "op": result.key.op,
        "topology": result.key.topology,
        "label": result.key.label,
        "collective": _single(result.training, "collective"),
        "model_kind": result.kind,
        "hyperparams": result.params,
        # features, baseline and the smoother's leave-one-out choice: DurationRegressor.from_artifact
        **model.artifact_state(),
        "data_fingerprint": result.fingerprint,
        "training_sha256": training_sha256,
        "booster_sha256": booster_sha256,
        "n_training": result.training.height,
        "metrics": {**result.metrics, "cv_mape": result.cv_mape, "noise_ape": result.noise_ape},
        "status": result.status,
        "timing": result.timing,  # the methods its training samples were timed by (sample_timing)
        "superseded": result.n_superseded,
        "versions": library_versions(),
        "created_at": created_at.isoformat(),
        "check": {
            "sample_ids": check.get_column("sample_id").to_list(),
            "predicted_ns": [float(v) for v in model.predict(feature_frame(check, result.key.family))],
        },
    }
    (directory / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return meta


def _single(frame: pl.DataFrame, column: str) -> str | None:
    if column not in frame.columns:
        return None
    values = frame.get_column(column).drop_nulls().unique().to_list()
    return str(values[0]) if len(values) == 1 else None


def save_results(
    con: duckdb.DuckDBPyConnection,
    store_dir: Path,
    cluster: str,
    results: list[GroupResult],
    *,
    family: str | None = None,
) -> int:
    """Write the fitted groups' artifacts and replace the cluster's rows in ``models``.

    Only the calibrated scope is replaced: the whole cluster, or one ``family``. Groups with too few
    samples have no model and get no row. Returns the number of models stored.
    """
    created_at = datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)
    target = cluster_dir(store_dir, cluster)
    rows = []
    fitted = [r for r in results if r.model is not None]
    for result in fitted:
        mid = model_id(cluster, result.key)
        directory = target / mid
        if directory.exists():
            shutil.rmtree(directory)  # a re-calibration replaces the artifact of the same group
        meta = _write_artifact(directory, cluster, result, created_at)
        rows.append(
            {
                "model_id": mid,
                "cluster": cluster,
                "family": result.key.family,
                "direction": result.key.direction,
                "op": result.key.op,
                "topology": result.key.topology,
                "model_kind": result.kind,
                "hyperparams_json": json.dumps(result.params, sort_keys=True),
                "features_json": json.dumps(meta["features"]),
                "n_train": result.n_train,
                "n_test": result.n_test,
                "n_excluded": result.n_excluded,
                "mape": result.metrics.get("mape"),
                "p50_ape": result.metrics.get("p50_ape"),
                "p90_ape": result.metrics.get("p90_ape"),
                "max_ape": result.metrics.get("max_ape"),
                "published_mape": result.published_mape,
                "cv_mape": result.cv_mape,
                "noise_ape": result.noise_ape,
                "protocol": result.protocol,
                "status": result.status,
                "data_fingerprint": result.fingerprint,
                "artifact_path": str(directory.resolve()),
                "schema_version": ARTIFACT_SCHEMA,
                "created_at": created_at,
            }
        )
    frame = pl.DataFrame(rows, schema=polars_schema(MODELS))
    stale = replace_rows(
        con,
        MODELS,
        frame.to_arrow(),
        where="cluster = ? AND (?::VARCHAR IS NULL OR family = ?)",
        params=[cluster, family, family],
        returning=("model_id", "artifact_path"),
    )
    kept = set(frame.get_column("model_id").to_list()) if frame.height else set()
    for mid, path in stale:
        # artifacts of groups that no longer exist; only directories this store wrote
        if mid not in kept and path and Path(path).is_dir() and Path(path).parent == target.resolve():
            shutil.rmtree(path)
    return frame.height


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", text)
    return tuple(int(p) for p in parts[:2])


@dataclass
class StoredModel:
    """One stored model: its metadata and (once loaded) the rebuilt regressor."""

    meta: dict[str, Any]
    directory: Path
    _model: DurationRegressor | None = None
    _training: pl.DataFrame | None = None

    @property
    def key(self) -> GroupKey:
        return GroupKey(self.meta["family"], self.meta["direction"], self.meta["op"], self.meta["topology"])

    @property
    def training(self) -> pl.DataFrame:
        if self._training is None:
            path = self.directory / "training.parquet"
            if not path.is_file():
                raise CalibrationError(
                    f"model artifact {self.directory} lacks training.parquet; "
                    f"re-run `calibrate --cluster {self.meta['cluster']}`"
                )
            content = path.read_bytes()
            training = pl.read_parquet(io.BytesIO(content))
            # artifacts written before the file hash was stored: the ids-and-durations fingerprint
            expected = self.meta.get("training_sha256")
            changed = (
                hashlib.sha256(content).hexdigest() != expected
                if expected is not None
                else data_fingerprint(training) != self.meta.get("data_fingerprint")
            )
            if changed:
                raise CalibrationError(
                    f"{path} is not the training data model {self.directory.name} was fitted on "
                    f"(changed since calibration); re-run `calibrate --cluster {self.meta['cluster']}`"
                )
            self._training = training
        return self._training

    @property
    def model(self) -> DurationRegressor:
        """The regressor, rebuilt on first use (forest refit, booster loaded) and checked."""
        if self._model is None:
            self._model = self._rebuild()
        return self._model

    def _rebuild(self) -> DurationRegressor:
        meta = self.meta
        booster = self._booster() if meta["model_kind"] in ("xgboost", "blend") else None
        training = self.training
        try:
            model = DurationRegressor.from_artifact(
                meta["hyperparams"],
                meta,
                feature_frame(training, meta["family"]),
                training.get_column("median_ns").to_numpy(),
                booster=booster,
            )
        except CalibrationError as exc:
            what = f"its stored smoother {meta['local']}" if meta.get("local") is not None else "it"
            raise CalibrationError(
                f"model {self.directory.name}: cannot refit {what} ({exc}); "
                f"re-run `calibrate --cluster {meta['cluster']}`"
            ) from exc
        self._check(model)
        return model

    def _booster(self) -> Any:
        """The saved booster (``booster.ubj``), checked against the hash stored at calibration."""
        path = self.directory / "booster.ubj"
        if not path.is_file():
            raise CalibrationError(
                f"model artifact {self.directory} lacks booster.ubj; "
                f"re-run `calibrate --cluster {self.meta['cluster']}`"
            )
        expected = self.meta.get("booster_sha256")
        if expected is not None and hashlib.sha256(path.read_bytes()).hexdigest() != expected:
            raise CalibrationError(
                f"{path} is not the booster model {self.directory.name} saved (changed since calibration); "
                f"re-run `calibrate --cluster {self.meta['cluster']}`"
            )
        booster = import_xgboost().XGBRegressor()
        booster.load_model(str(path))
        return booster

    def _check(self, model: DurationRegressor) -> None:
        check = self.meta["check"]
        wanted = pl.DataFrame({"sample_id": check["sample_ids"], "_order": range(len(check["sample_ids"]))})
        rows = self.training.join(wanted, on="sample_id").sort("_order").drop("_order")
        predicted = model.predict(feature_frame(rows, self.meta["family"]))
        expected = np.asarray(check["predicted_ns"][: rows.height])
        if rows.height != len(check["sample_ids"]) or not np.allclose(predicted, expected, rtol=CHECK_RTOL):
            raise CalibrationError(
                f"model {self.directory.name} does not reproduce its stored predictions after loading "
                f"(libraries {self.meta['versions']}); re-run `calibrate --cluster {self.meta['cluster']}`"
            )


def read_artifact(directory: Path) -> StoredModel:
    """The metadata of one stored model, version-checked (the regressor is rebuilt on first use).

    Raises:
        CalibrationError: missing/corrupt metadata, another artifact schema, or libraries older or of
            another scikit-learn minor version than the ones that fitted it.
    """
    path = directory / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CalibrationError(f"cannot read model metadata {path}: {exc}; re-run calibrate") from exc
    if not isinstance(meta, dict):
        raise CalibrationError(f"model metadata {path} is not a JSON object; re-run calibrate")
    if meta.get("artifact_schema") != ARTIFACT_SCHEMA:
        raise CalibrationError(
            f"{path} has artifact schema {meta.get('artifact_schema')}, this tracecal reads {ARTIFACT_SCHEMA}; "
            f"re-run `calibrate --cluster {meta.get('cluster')}`"
        )
    missing = [key for key in REQUIRED_META if key not in meta]
    if missing:
        raise CalibrationError(
            f"model metadata {path} lacks {', '.join(missing)}; re-run `calibrate --cluster {meta.get('cluster')}`"
        )
    saved = meta.get("versions", {})
    current = library_versions()
    forest_kinds = ("random_forest", "blend", "local_forest")
    if meta["model_kind"] in forest_kinds and _version_tuple(saved.get("scikit-learn", "")) != (
        _version_tuple(current["scikit-learn"])
    ):
        raise CalibrationError(
            f"model {directory.name} was fitted with scikit-learn {saved.get('scikit-learn')}, this is "
            f"{current['scikit-learn']}; re-run `calibrate --cluster {meta['cluster']}`"
        )
    if meta["model_kind"] in ("xgboost", "blend") and _version_tuple(current["xgboost"]) < _version_tuple(
        saved.get("xgboost", "0")
    ):
        raise CalibrationError(
            f"model {directory.name} was saved by xgboost {saved.get('xgboost')}, newer than the installed "
            f"{current['xgboost']}; upgrade xgboost or re-run `calibrate --cluster {meta['cluster']}`"
        )
    return StoredModel(meta=meta, directory=directory)


def cluster_dir(store_dir: Path, cluster: str) -> Path:
    """Where the artifacts of ``cluster`` live in the store."""
    return store_dir / re.sub(r"[^A-Za-z0-9_.-]+", "_", cluster)


def read_models(con: duckdb.DuckDBPyConnection, cluster: str, store_dir: Path | None = None) -> list[StoredModel]:
    """Every stored model of ``cluster`` (from the ``models`` table), version-checked.

    Artifacts are looked up in ``store_dir`` (the database's model store; the store moves with the
    database) and, without one, at the ``artifact_path`` recorded at calibration time.

    Raises:
        CalibrationError: the cluster has no models, or an artifact is missing or incompatible.
    """
    rows = con.execute(
        "SELECT model_id, artifact_path FROM models WHERE cluster = ? ORDER BY model_id", [cluster]
    ).fetchall()
    if not rows:
        known = [r[0] for r in con.execute("SELECT DISTINCT cluster FROM models ORDER BY 1").fetchall()]
        hint = f"calibrated clusters: {', '.join(known)}" if known else "no cluster is calibrated yet"
        raise CalibrationError(
            f"no calibrated models for cluster {cluster!r} ({hint}); run `calibrate --cluster {cluster}`"
        )
    models = []
    for mid, path in rows:
        directory = cluster_dir(store_dir, cluster) / mid if store_dir is not None else Path(path)
        if not directory.is_dir():
            raise CalibrationError(f"model {mid}: artifact directory {directory} is missing; re-run calibrate")
        models.append(read_artifact(directory))
    return models

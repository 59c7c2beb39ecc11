"""Calibrated duration models of a cluster, as the replay asks for them (``DurationModel``).

Calibration (``tracecal.calibrate``) fits, stores and routes the regressors; this module only loads a
cluster's models for the replay, which hands them its operator and collective-instance rows.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracecal.predict.durations import DurationModel


def load_duration_model(con: duckdb.DuckDBPyConnection, store_dir: Path, cluster: str) -> DurationModel:
    """The calibrated models of ``cluster`` (``models`` table rows and their artifacts in ``store_dir``).

    Raises:
        CalibrationError: the cluster has no models, or an artifact is missing or incompatible (the
            message says to run ``calibrate --cluster NAME``).
    """
    from tracecal.calibrate import load

    return load(cluster, con=con, store_dir=store_dir)

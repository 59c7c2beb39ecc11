"""Calibrated duration models of a cluster, adapted to what the replay asks (``DurationModel``).

Calibration (``tracecal.calibrate``) fits and stores the regressors; this module only loads them for
a cluster and hands the replay's operator and collective rows to them.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracecal.errors import CalibrationError
from tracecal.predict.durations import DurationModel


def load_duration_model(con: duckdb.DuckDBPyConnection, store_dir: Path, cluster: str) -> DurationModel:
    """The calibrated models of ``cluster`` (from the ``models`` table and the model store).

    Raises:
        CalibrationError: the cluster has no calibrated models (the message says how to make them).
    """
    from tracecal import calibrate

    loader = getattr(calibrate, "load", None)
    if loader is None:
        raise CalibrationError(
            "this tracecal build has no calibrated-model loader (tracecal.calibrate.load); "
            "replay with --mode measured or --scale FAMILY=FACTOR"
        )
    return loader(cluster, con=con, store_dir=store_dir)

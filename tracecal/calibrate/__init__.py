"""Features, regressors, validation and the model store for calibrated operator cost models.

The steps of `calibrate` (read a cluster's samples, fit and select per group, store, validate in the
trace) are `tracecal.api.Session.calibrate_report`'s; this package holds what they compute. Loading:
``load(cluster, con, store_dir=...)`` returns ``CalibratedModels`` whose ``predict(rows) ->
durations_ns`` the replay calls on ``operators`` and collective rows (from a notebook:
``tracecal.open(db).models(cluster)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

    from tracecal.calibrate.routing import CalibratedModels


def load(cluster: str, con: duckdb.DuckDBPyConnection, *, store_dir: Path | None = None) -> CalibratedModels:
    """The calibrated models of ``cluster``: ``load(cluster, con).predict(rows) -> durations_ns``.

    ``store_dir`` is the database's model store (``config.model_store_dir(db)``); without it, each
    artifact is read where calibration recorded it. Each regressor is rebuilt from its artifact on
    first use (``DurationRegressor.from_artifact``). See ``tracecal.calibrate.routing`` for what
    ``predict`` accepts and how rows are routed to models.

    Raises:
        CalibrationError: the cluster has no models, or an artifact is missing or incompatible.
    """
    from tracecal.calibrate.routing import CalibratedModels
    from tracecal.calibrate.store import read_models

    return CalibratedModels(cluster, read_models(con, cluster, store_dir))


__all__ = ["load"]

"""Features, regressors, validation and the model store for calibrated operator cost models.

Entry points: ``calibrate_cluster(con, cluster, store_dir=...)`` fits, validates and stores a
cluster's regressors; ``load(cluster, con=...)`` returns ``CalibratedModels`` whose
``predict(rows) -> durations_ns`` the replay calls on ``operators`` and collective rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    import duckdb
    import polars as pl

    from tracecal.calibrate.fitting import GroupKey, GroupResult
    from tracecal.calibrate.routing import CalibratedModels


@dataclass
class Calibration:
    """What ``calibrate_cluster`` did: per-group results, the hold-out report and models stored."""

    cluster: str
    results: list[GroupResult]
    report: pl.DataFrame
    stored: int


def calibrate_cluster(
    con: duckdb.DuckDBPyConnection,
    cluster: str,
    *,
    store_dir: Path,
    family: str | None = None,
    published: pl.DataFrame | None = None,
    folds: int = 3,
    n_jobs: int = 2,
    on_group: Callable[[GroupKey, int, int], None] | None = None,
) -> Calibration:
    """Fit, validate and store the regressors of ``cluster`` from its samples.

    Args:
        con: an open tracecal database (samples are read, ``models`` rows replaced).
        cluster: cluster name in the ``samples`` table.
        store_dir: the model store (``config.model_store_dir(db_path)``).
        family: calibrate only this family (other families' models are kept).
        published: ``published_errors`` rows to report next to ours (GPUModeling25 samples).
        folds: k of the k-fold model selection.
        on_group: progress callback (key, index, total).

    Raises:
        SampleError: the cluster has no samples.
        CalibrationError: no group of the cluster has enough samples to fit.
    """
    from tracecal.calibrate.fitting import calibrate_samples, report_frame
    from tracecal.calibrate.store import save_results
    from tracecal.errors import CalibrationError
    from tracecal.sql.samples import read_samples

    samples = read_samples(con, cluster, family=family)
    results = calibrate_samples(
        samples, cluster, published=published, family=family, folds=folds, n_jobs=n_jobs, on_group=on_group
    )
    if not results:
        what = f"family {family!r} of " if family else ""
        raise CalibrationError(
            f"no samples of a modelled family for {what}cluster {cluster!r}; sample compute ops or collectives first"
        )
    stored = save_results(con, store_dir, cluster, results, family=family)
    return Calibration(cluster=cluster, results=results, report=report_frame(results), stored=stored)


def load(
    cluster: str,
    con: duckdb.DuckDBPyConnection | None = None,
    *,
    db: Path | None = None,
    store_dir: Path | None = None,
) -> CalibratedModels:
    """The calibrated models of ``cluster``: ``load(cluster, con=con).predict(rows) -> durations_ns``.

    Give an open connection (``con``) or a database path (``db``; opened read-only for the load).
    ``store_dir`` defaults to the database's model store. See ``tracecal.calibrate.routing`` for what
    ``predict`` accepts and how rows are routed to models.

    Raises:
        CalibrationError: the cluster has no models, or an artifact is missing or incompatible.
    """
    from tracecal.calibrate.routing import CalibratedModels
    from tracecal.calibrate.store import read_models
    from tracecal.config import model_store_dir
    from tracecal.errors import CalibrationError
    from tracecal.sql.connection import open_database

    if con is None:
        if db is None:
            raise CalibrationError("load() needs an open connection (con=) or a database path (db=)")
        with open_database(db, read_only=True) as own:
            models = read_models(own, cluster, store_dir or model_store_dir(db))
        return CalibratedModels(cluster, models)
    if store_dir is None and db is not None:
        store_dir = model_store_dir(db)
    return CalibratedModels(cluster, read_models(con, cluster, store_dir))


def validate_in_trace(con: duckdb.DuckDBPyConnection, cluster: str, *, store_dir: Path) -> pl.DataFrame | None:
    """In-trace validation: the cluster's stored models against the traced operators of its ingested
    runs (``in_trace.in_trace_report`` rows); None when no ingested run has ``cluster``.

    Raises:
        CalibrationError: the cluster has runs but no usable models (see ``load``).
    """
    from tracecal.calibrate.in_trace import in_trace_report, traced_rows

    rows = traced_rows(con, cluster)
    if rows.height == 0:
        return None
    models = load(cluster, con, store_dir=store_dir)
    return in_trace_report(rows, models.predict(rows))


__all__ = ["Calibration", "calibrate_cluster", "load", "validate_in_trace"]

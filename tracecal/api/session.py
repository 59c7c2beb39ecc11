"""`Session`: the steps behind each CLI command, on one database, returning polars DataFrames.

A method named like a command returns that command's main table as a DataFrame; where the command
shows more than one table, a ``*_report`` method beside it returns everything the command renders
(the CLI calls that one). Methods open the database for the length of one call, as each CLI command
does, so a session never holds DuckDB's write lock between calls. Nothing here prints: failures are
`TracecalError` subclasses with one actionable line, warnings travel in the returned reports, and long
steps take an optional ``progress`` callback.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tracecal.config import Settings, model_store_dir
from tracecal.errors import InputNotFoundError, PredictionError, RunNotFoundError, SampleError, TracecalError

if TYPE_CHECKING:  # the cores load when a method runs: `import tracecal` stays quick
    import duckdb
    import polars as pl
    import pyarrow as pa

    from tracecal.api.demo import DemoPlan, DemoReport, DemoStage
    from tracecal.api.sampling import CommSampling, ComputeSampling
    from tracecal.calibrate.fitting import GroupResult
    from tracecal.calibrate.routing import CalibratedModels
    from tracecal.pipeline.ingest import IngestReport, Progress
    from tracecal.predict.diff import Diff
    from tracecal.predict.durations import DurationModel
    from tracecal.predict.export_store import ExportResult
    from tracecal.predict.relayout_run import LayoutPrediction
    from tracecal.predict.run import Prediction
    from tracecal.predict.search import SearchResult
    from tracecal.predict.store import StoredIteration
    from tracecal.samplers.plan import ComputePlan
    from tracecal.sources.gpumodeling25.validate.published_runs import PublishedValidation
    from tracecal.sql.iterations import IterationReport
    from tracecal.vocabulary import ParallelLayout
    from tracecal.workload import WorkloadConfig
    from tracecal.workload.launch import LocalRun

Mode = Literal["measured", "predicted", "scaled"]

_LAYOUT_NEEDS_CLUSTER = "predicting a layout needs --cluster NAME (or --mode measured for the traced durations)"
"""`search` and `predict --layout` in predicted mode without a cluster."""


def open(db: str | Path | None = None) -> Session:
    """A session on the database at ``db`` (default: ``$TRACECAL_DB``, else ``./tracecal.duckdb``)."""
    return Session(db)


def resolve_mode(mode: str | None, cluster: str | None, scale: Sequence[str]) -> str:
    """The replay mode a command runs in: the one given, else predicted with a cluster, scaled with
    ``--scale`` factors, else measured."""
    if mode is not None:
        return mode
    if cluster:
        return "predicted"
    return "scaled" if scale else "measured"


@dataclass(frozen=True)
class IterationsReport:
    """What `tracecal iterations RUN` shows: the per-iteration report and, for a decoded run stored
    with its GPT-NeoX log, the Table 8 figures (``None`` otherwise)."""

    report: IterationReport
    table8: dict[str, Any] | None


@dataclass(frozen=True)
class PredictReport:
    """What `tracecal predict RUN` shows. ``table``: rank, component, measured_ms, predicted_ms, error_pct,
    covered_share, dependency_error_pct, unexplained_pct (with ``attribute``, the attribution's parts).
    ``what_if``: the prediction changes the traced run (another cluster, node size or scale), so its
    difference to the measurement is a change, not an error."""

    run: str
    mode: str
    cluster: str | None
    table: pl.DataFrame
    prediction: Prediction
    stored: StoredIteration
    what_if: bool
    decoded: bool
    source_cluster: str | None
    gpus_per_node: int | None
    gpus_per_node_source: str | None
    ratios: dict[str, Any]
    attribution: pl.DataFrame | None
    fallback: ModelFallback | None = None


@dataclass(frozen=True)
class ModelFallback:
    """What a predicted replay did where the cluster had no model (``PredictReport.fallback``).

    ``scaled``: families whose measured durations were scaled by a cross-cluster ratio (see
    ``PredictReport.ratios``). ``kept``: ``what_if.measured_fallback``'s rows (what, rank, share_pct,
    and a ``total`` row), operator time kept as traced. ``mostly_measured``: the total is above
    ``what_if.MOSTLY_MEASURED`` of a rank's iteration. On another cluster than the trace's:
    ``carried_pct``, the operator time carried over unscaled, and ``idle_pct``, the most the GPUs sit
    idle in a rank's predicted iteration (CPU-side gaps are carried over as they are)."""

    scaled: list[str]
    kept: pl.DataFrame
    mostly_measured: bool
    carried_pct: float | None
    idle_pct: float | None


def model_fallback(pred: Prediction, source: str | None, cluster: str | None, ratios: dict[str, Any]) -> ModelFallback:
    """The ``ModelFallback`` of a predicted replay of a run traced on ``source`` with ``cluster``'s models."""
    import polars as pl

    from tracecal.predict.durations import measured_share
    from tracecal.predict.what_if import MOSTLY_MEASURED, idle_share, measured_fallback

    scaled = (
        sorted(set(pred.graph.nodes["family"].fill_null("other").to_numpy()[pred.durations.source == "ratio"]))
        if ratios
        else []
    )
    kept = measured_fallback(pred)
    total = kept.filter(pl.col("what") == "total")
    elsewhere = source is not None and cluster is not None and source != cluster
    return ModelFallback(
        scaled=scaled,
        kept=kept,
        mostly_measured=bool(total.height and total["share_pct"][0] > 100 * MOSTLY_MEASURED),
        carried_pct=100 * measured_share(pred.graph, pred.durations) if elsewhere else None,
        idle_pct=idle_share(pred) if elsewhere else None,
    )


SAMPLE_FORMATS = ("gpumodeling25", "parquet")
"""What `samples import` reads: the published GPUModeling25 CSVs, or Parquet from `samples export`."""


@dataclass(frozen=True)
class SamplesImport:
    """What `samples import` wrote: samples, files read (GPUModeling25 only) and flags per reason
    (GPUModeling25 only; Parquet samples keep the flags they were exported with)."""

    samples: int
    files: int | None
    flags: dict[str, int] | None


@dataclass(frozen=True)
class Calibration:
    """What `calibrate` did: the per-group fits, the hold-out report (one row per op × direction), the
    models stored and the comparison with the published errors."""

    cluster: str
    results: list[GroupResult]
    report: pl.DataFrame
    stored: int
    comparison: list[dict[str, Any]]
    """Per scope (compute, comm): our hold-out errors beside the published ones
    (``validation.published_comparison``)."""


@dataclass(frozen=True)
class ValidateReport:
    """What `tracecal validate` shows. ``decoded``: the decoded GPT-NeoX runs scored like the published
    Table 9; ``traced``: (run id, prediction) of the traced runs. With ``attribute``,
    ``published_attribution`` splits each decoded run's Table 9 cells by the schedule and the op
    families, and ``traced_attribution`` each traced run's components per rank
    (``attribution.component_attribution`` rows with ``run_id``)."""

    mode: str
    cluster: str | None
    decoded: list[PublishedValidation]
    traced: list[tuple[str, Prediction]]
    published_attribution: list[pl.DataFrame] | None
    traced_attribution: pl.DataFrame | None = None


class Session:
    """One database. Each method mirrors a CLI command; `tracecal.api.commands.COMMAND_METHODS` maps them."""

    def __init__(self, db: str | Path | None = None) -> None:
        self.settings = Settings.resolve(None if db is None else Path(db))

    @property
    def db_path(self) -> Path:
        return self.settings.db_path

    @property
    def model_dir(self) -> Path:
        """Where `calibrate` stores the cluster models: ``<db stem>.models/`` beside the database."""
        return model_store_dir(self.db_path)

    def __repr__(self) -> str:
        return f"tracecal.open({str(self.db_path)!r})"

    @contextmanager
    def connect(self, *, read_only: bool = False, threads: int | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """The database for one step (created with the current schema when it does not exist yet; read-only:
        `InputNotFoundError` when it does not)."""
        from tracecal.sql.connection import open_database

        with open_database(
            self.db_path, read_only=read_only, cache_dir=self.settings.cache_dir, threads=threads
        ) as con:
            yield con

    @contextmanager
    def scratch_database(self, work_dir: Path | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """A fresh database made like this session's (from its template cache) in a temporary folder under
        ``work_dir`` (default: the system's), removed afterwards: where `predict --layout` and `search`
        store and replay a rebuilt run, leaving this session's database as it was."""
        import shutil
        import tempfile

        from tracecal.sql.connection import open_database

        folder = Path(tempfile.mkdtemp(prefix="tracecal-relayout-", dir=work_dir))
        try:
            with open_database(folder / "relayout.duckdb", cache_dir=self.settings.cache_dir) as con:
                yield con
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # -- sql, runs, iterations ------------------------------------------------------------------

    def sql(self, query: str, *, write: bool = False) -> pl.DataFrame:
        """`tracecal sql`: the result of the last statement of ``query`` (read-only unless ``write``)."""
        import polars as pl

        return pl.from_arrow(self.sql_arrow(query, write=write))  # type: ignore[return-value]

    def sql_arrow(self, query: str, *, write: bool = False) -> pa.Table:
        """`sql` as DuckDB's own Arrow table (its column types kept exactly, as `tracecal sql` writes them)."""
        from tracecal.sql.query import run_query

        with self.connect(read_only=not write) as con:
            return run_query(con, query)

    def sql_file(self, path: str | Path, *, write: bool = False) -> pl.DataFrame:
        """`tracecal sql --file PATH`."""
        path = Path(path)
        if not path.is_file():
            raise InputNotFoundError(f"SQL file {path} does not exist")
        return self.sql(path.read_text(), write=write)

    def runs(self) -> pl.DataFrame:
        """`tracecal runs`: run_id, format, layout, ranks, world_size, events, span_ms, cluster, ingested_at,
        source_path (empty when nothing is ingested)."""
        import polars as pl

        from tracecal.sql.query import list_runs

        with self.connect(read_only=True) as con:
            return pl.from_arrow(list_runs(con))  # type: ignore[return-value]

    def iterations(self, run: str) -> pl.DataFrame:
        """`tracecal iterations RUN`: one row per iteration (its time on the slowest rank)."""
        import polars as pl

        return pl.from_arrow(self.iterations_report(run).report.iterations)  # type: ignore[return-value]

    def iterations_report(self, run: str) -> IterationsReport:
        """Everything `tracecal iterations RUN` shows: statistics, best iteration, clock offsets, Table 8."""
        from tracecal.sources.gpumodeling25.read.tables import NEOX_LOG_KEY, table8_from_metadata
        from tracecal.sql.iterations import iteration_report
        from tracecal.sql.query import run_metadata

        with self.connect(read_only=True) as con:
            report = iteration_report(con, run)
            metadata = run_metadata(con, run)
        table8 = table8_from_metadata(metadata) if NEOX_LOG_KEY in metadata else None
        return IterationsReport(report, table8)

    # -- ingest ---------------------------------------------------------------------------------

    def ingest_report(
        self,
        paths: str | Path | Sequence[str | Path],
        *,
        run_id: str | None = None,
        workers: int | None = None,
        on_error: str = "raise",
        cluster: str | None = None,
        layout: ParallelLayout | None = None,
        iteration_marker: str | None = None,
        dask: str | None = None,
        shard_dir: str | Path | None = None,
        progress: Callable[[Progress], None] | None = None,
    ) -> IngestReport:
        """`trace-ingest PATH...`: find each run's rank traces, parse, decode and store them (one transaction
        per run; re-ingesting replaces). ``progress`` gets a `pipeline.ingest.Progress` after each file."""
        import os

        from tracecal.pipeline.ingest import INGEST_THREADS, IngestOptions, ingest_runs
        from tracecal.vocabulary import ParallelLayout

        if on_error not in ("raise", "skip"):
            raise TracecalError(f"--on-error must be raise or skip, not {on_error!r}")
        if iteration_marker is not None:
            try:
                re.compile(iteration_marker)
            except re.error as exc:
                raise TracecalError(f"--iteration-marker {iteration_marker!r} is not a valid regex: {exc}") from exc
        if dask is not None:
            _check_dask_installed()
        runs = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
        options = IngestOptions(
            run_id=run_id,
            workers=workers or os.cpu_count() or 1,
            on_error="skip" if on_error == "skip" else "raise",
            cluster=cluster,
            iteration_marker=iteration_marker,
            layout=layout or ParallelLayout(),
            dask=dask,
            shard_dir=Path(shard_dir) if shard_dir is not None else self.db_path.absolute().parent,
        )
        with self.connect(threads=INGEST_THREADS) as con:
            return ingest_runs(con, runs, options, progress=progress)

    def ingest(
        self,
        paths: str | Path | Sequence[str | Path],
        *,
        cluster: str | None = None,
        pp: int | None = None,
        tp: int | None = None,
        dp: int | None = None,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        **options: Any,
    ) -> pl.DataFrame:
        """`trace-ingest PATH...` returning one row per run stored: run_id, format, ranks, world_size,
        files, events, kernels, seconds, mb_per_s, warnings. Other options as `ingest_report`."""
        import polars as pl

        from tracecal.vocabulary import ParallelLayout

        layout = ParallelLayout(pp=pp, tp=tp, dp=dp, nodes=nodes, gpus_per_node=gpus_per_node)
        report = self.ingest_report(paths, cluster=cluster, layout=layout, **options)
        if not report.runs:
            why = "; ".join(f"{s.path}: {s.reason}" for s in report.skipped) or "no trace files found"
            raise InputNotFoundError(f"nothing ingested ({why})")
        return pl.DataFrame(
            [
                {
                    "run_id": r.run_id,
                    "format": r.format,
                    "ranks": r.ranks,
                    "world_size": r.world_size,
                    "files": r.files_read,
                    "events": r.events,
                    "kernels": r.kernels,
                    "seconds": r.seconds,
                    "mb_per_s": r.mb_per_s,
                    "warnings": len(r.warnings) + len(r.skipped),
                }
                for r in report.runs
            ]
        )

    # -- predict, validate ----------------------------------------------------------------------

    def duration_model(self, con: duckdb.DuckDBPyConnection, cluster: str) -> DurationModel:
        """The calibrated models of ``cluster`` (the error says to run `calibrate` when there are none)."""
        from tracecal.calibrate import load

        return load(cluster, con, store_dir=self.model_dir)

    def _predicted_model(
        self, con: duckdb.DuckDBPyConnection, mode: str, cluster: str | None, without_cluster: str
    ) -> DurationModel | None:
        """``cluster``'s calibrated models when ``mode`` is predicted, else None (measured or scaled).

        Raises:
            PredictionError: predicted mode without a cluster (``without_cluster``: the message).
        """
        if mode != "predicted":
            return None
        if not cluster:
            raise PredictionError(without_cluster)
        return self.duration_model(con, cluster)

    def predict(
        self,
        run: str,
        *,
        cluster: str | None = None,
        mode: Mode | None = None,
        scale: Sequence[str] = (),
        iteration: int | None = None,
        replay: str = "fitted",
        gpus_per_node: int | None = None,
        attribute: bool = False,
    ) -> pl.DataFrame:
        """`tracecal predict RUN`: measured vs predicted time per rank and component (see `predict_report`)."""
        return self.predict_report(
            run, cluster=cluster, mode=mode, scale=scale, iteration=iteration, replay=replay,
            gpus_per_node=gpus_per_node, attribute=attribute,
        ).table  # fmt: skip

    def predict_report(
        self,
        run: str,
        *,
        cluster: str | None = None,
        mode: Mode | str | None = None,
        scale: Sequence[str] = (),
        iteration: int | None = None,
        replay: str = "fitted",
        gpus_per_node: int | None = None,
        attribute: bool = False,
    ) -> PredictReport:
        """Replay RUN's best iteration (or ``iteration``) across all ranks and store the prediction in the
        predictions and components tables. Mode as `resolve_mode`; ``scale``: FAMILY=FACTOR what-ifs."""
        from tracecal.predict.durations import parse_scale
        from tracecal.predict.store import predict_stored_run, store_prediction
        from tracecal.predict.what_if import is_what_if, run_cluster, target_gpus_per_node
        from tracecal.sources.gpumodeling25.validate.published_runs import is_decoded_run, with_published_iteration

        factors = parse_scale(list(scale))
        resolved = resolve_mode(mode, cluster, scale)
        with self.connect() as con:
            model = self._predicted_model(
                con, resolved, cluster, "--mode predicted needs --cluster NAME (see `tracecal sql 'from models'`)"
            )
            gpn, gpn_source = target_gpus_per_node(
                con, run, cluster if resolved == "predicted" else None, gpus_per_node
            )
            source = run_cluster(con, run)
            ratios = _cross_cluster_ratios(con, run, source, cluster) if resolved == "predicted" else {}
            stored, pred = predict_stored_run(
                con, run, mode=resolved, model=model, scale=factors, iteration=iteration, replay=replay,
                gpus_per_node=gpn, fallback={f: r.factor for f, r in ratios.items()},
            )  # fmt: skip
            decoded = is_decoded_run(con, run)
            if decoded:
                pred = with_published_iteration(con, run, pred)
            store_prediction(con, run, pred, cluster=cluster)
        table = component_table_ms(pred)
        attribution = None
        if attribute:
            from tracecal.predict.attribution import as_percent, component_attribution

            attribution = component_attribution(pred)
            parts = as_percent(attribution).drop("measured_ns", "predicted_ns", "error_pct")
            table = table.join(parts, on=["rank", "component"], how="left", maintain_order="left")
        return PredictReport(
            run=run, mode=resolved, cluster=cluster, table=table, prediction=pred, stored=stored,
            what_if=is_what_if(resolved, source, cluster, gpn), decoded=decoded, source_cluster=source,
            gpus_per_node=gpn, gpus_per_node_source=gpn_source, ratios=ratios, attribution=attribution,
            fallback=model_fallback(pred, source, cluster, ratios) if resolved == "predicted" else None,
        )  # fmt: skip

    def validate(
        self,
        runs: Sequence[str] = (),
        *,
        cluster: str | None = None,
        mode: Mode | None = None,
        scale: Sequence[str] = (),
        progress: Callable[[str, int, int], None] | None = None,
    ) -> pl.DataFrame:
        """`tracecal validate`: predict every run (default: the cluster's runs, else all) and score it.
        Decoded GPT-NeoX runs give the published Table 9 rows (run_id, component, measured_ms, predicted_ms,
        error_pct, published_error_pct, ...); traced runs the component table, one error-% column per run.
        The two kinds are scored differently, so validate them separately (see `validate_report`)."""
        import polars as pl

        from tracecal.predict.validate import error_table

        report = self.validate_report(runs, cluster=cluster, mode=mode, scale=scale, progress=progress, mixed=False)
        if report.decoded:
            return pl.concat([v.components for v in report.decoded], how="diagonal_relaxed")
        return error_table(pl.concat([p.components.with_columns(pl.lit(r).alias("run_id")) for r, p in report.traced]))

    def validate_report(
        self,
        runs: Sequence[str] = (),
        *,
        cluster: str | None = None,
        mode: Mode | str | None = None,
        scale: Sequence[str] = (),
        attribute: bool = False,
        mixed: bool = True,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> ValidateReport:
        """Predict every run. ``mixed=False`` refuses decoded and traced runs together (one table cannot
        hold both); ``attribute`` splits the decoded runs' Table 9 cells (a traced run's attribution comes
        from its prediction, `predict.attribution.component_attribution`). ``progress(run, index, total)``
        is called before each run."""
        from tracecal.predict.durations import parse_scale
        from tracecal.predict.store import predict_stored_run, store_prediction
        from tracecal.sources.gpumodeling25.validate.published_runs import is_decoded_run, validate_decoded_run

        factors = parse_scale(list(scale))
        resolved = resolve_mode(mode, cluster, scale)
        with self.connect() as con:
            run_ids = list(runs) or default_runs(con, cluster)
            decoded_ids = [r for r in run_ids if is_decoded_run(con, r)]
            traced_ids = [r for r in run_ids if r not in decoded_ids]
            if decoded_ids and traced_ids and not mixed:
                raise PredictionError(
                    f"runs {', '.join(decoded_ids)} are decoded GPT-NeoX runs (scored like the published Table 9) "
                    f"and {', '.join(traced_ids)} are traces (component table): validate them separately by run id"
                )
            model = self._predicted_model(con, resolved, cluster, "validate in predicted mode needs --cluster NAME")
            if attribute and resolved == "measured":
                raise PredictionError(
                    "--attribute splits a prediction's error by family: pass --cluster NAME or --scale FAMILY=FACTOR"
                )
            ordered = decoded_ids + traced_ids
            decoded, traced = [], []
            for i, run_id in enumerate(ordered):
                if progress is not None:
                    progress(run_id, i, len(ordered))
                if run_id in decoded_ids:
                    result = validate_decoded_run(con, run_id, mode=resolved, model=model, scale=factors)
                    store_prediction(con, run_id, result.prediction, cluster=cluster)
                    decoded.append(result)
                else:
                    _, pred = predict_stored_run(con, run_id, mode=resolved, model=model, scale=factors)
                    store_prediction(con, run_id, pred, cluster=cluster)
                    traced.append((run_id, pred))
            cells = _published_attribution(con, decoded) if attribute and decoded else None
        per_rank = None
        if attribute and traced:
            import polars as pl

            from tracecal.predict.attribution import component_attribution

            per_rank = pl.concat(
                [component_attribution(p).with_columns(pl.lit(r).alias("run_id")) for r, p in traced],
                how="diagonal_relaxed",
            )
        return ValidateReport(resolved, cluster, decoded, traced, cells, per_rank)

    # -- calibrate, samples ---------------------------------------------------------------------

    def calibrate(
        self,
        cluster: str,
        *,
        family: str | None = None,
        published: Sequence[str | Path] = (),
        folds: int = 3,
        progress: Callable[[Any, int, int], None] | None = None,
    ) -> pl.DataFrame:
        """`calibrate --cluster NAME`: fit, select and store the cluster's regressors; the hold-out table
        (op, direction, model, n_train, n_test, mape, p90_ape, published_mape, ...). See `calibrate_report`."""
        return self.calibrate_report(cluster, family=family, published=published, folds=folds, progress=progress)[
            0
        ].report

    def calibrate_report(
        self,
        cluster: str,
        *,
        family: str | None = None,
        published: Sequence[str | Path] = (),
        folds: int = 3,
        progress: Callable[[Any, int, int], None] | None = None,
        in_trace: bool = True,
    ) -> tuple[Calibration, pl.DataFrame | None]:
        """Read the cluster's samples, fit and select a regressor per model group, store them (one
        transaction for the ``models`` rows; only ``family``'s when given), and validate them on the
        operators of the cluster's ingested runs. Returns the calibration (hold-out table, models
        stored) and that in-trace table (``None`` when no run has that cluster, or without
        ``in_trace``). ``published``: directories of GPUModeling25 tuned-config files whose errors to
        set beside ours; ``progress(group, index, total)`` after each model group.

        Raises:
            SampleError: the cluster has no samples.
            CalibrationError: no group has enough samples to fit; stored models that do not load.
        """
        import polars as pl

        from tracecal.calibrate import load
        from tracecal.calibrate.fitting import calibrate_samples, report_frame
        from tracecal.calibrate.in_trace import in_trace_report, traced_rows
        from tracecal.calibrate.store import save_results
        from tracecal.calibrate.validation import published_comparison
        from tracecal.errors import CalibrationError
        from tracecal.sql.samples import read_samples

        published_frame = None
        if published:
            from tracecal.sources.gpumodeling25.samples.importer import published_errors

            published_frame = pl.concat([published_errors(Path(d)) for d in published])
        with self.connect() as con:
            samples = read_samples(con, cluster, family=family)
            results = calibrate_samples(
                samples, cluster, published=published_frame, family=family, folds=folds, n_jobs=2, on_group=progress
            )
            if not results:
                what = f"family {family!r} of " if family else ""
                raise CalibrationError(
                    f"no samples of a modelled family for {what}cluster {cluster!r}; sample compute ops or "
                    "collectives first"
                )
            stored = save_results(con, self.model_dir, cluster, results, family=family)
            report = report_frame(results)
            calibration = Calibration(cluster, results, report, stored, published_comparison(report))
            # in-trace validation: the stored models against the traced operators of the cluster's runs
            rows = traced_rows(con, cluster) if in_trace else None
            trace_table = None
            if rows is not None and rows.height:
                trace_table = in_trace_report(rows, load(cluster, con, store_dir=self.model_dir).predict(rows))
        return calibration, trace_table

    def models(self, cluster: str) -> CalibratedModels:
        """The stored models of ``cluster``: ``.predict(rows) -> durations_ns`` on ``operators`` or
        collective rows (each regressor rebuilt from its artifact on first use)."""
        from tracecal.calibrate import load

        with self.connect(read_only=True) as con:
            return load(cluster, con, store_dir=self.model_dir)

    def samples_import(
        self,
        path: str | Path,
        *,
        cluster: str | None = None,
        fmt: str = "gpumodeling25",
        progress: Callable[[int, int, str], None] | None = None,
    ) -> pl.DataFrame:
        """`tracecal samples import PATH`: the published GPUModeling25 CSVs of a directory (``cluster``
        required), or Parquet from `samples export` (``fmt="parquet"``). Returns the samples' overview
        (cluster, family, op, direction, source, devices, samples, flagged, ...) after the import."""
        self.samples_import_report(path, cluster=cluster, fmt=fmt, progress=progress)
        return self.samples_list(cluster=cluster)

    def samples_import_report(
        self,
        path: str | Path,
        *,
        cluster: str | None = None,
        fmt: str = "gpumodeling25",
        progress: Callable[[int, int, str], None] | None = None,
    ) -> SamplesImport:
        """What the import wrote: samples, files read (GPUModeling25) and samples flagged per reason.
        Re-importing replaces; a bad file writes nothing."""
        path = Path(path)
        if fmt not in SAMPLE_FORMATS:
            raise SampleError(f"unknown --format {fmt!r}; use one of {', '.join(SAMPLE_FORMATS)}")
        if fmt == "gpumodeling25":
            from tracecal.sources.gpumodeling25.samples.importer import import_gpumodeling25

            if not cluster:
                raise SampleError("--cluster NAME is required with --format gpumodeling25 (e.g. --cluster perlmutter)")
            with self.connect() as con:
                result = import_gpumodeling25(con, path, cluster, progress=progress)
            return SamplesImport(result.samples, result.files, dict(result.flags))
        from tracecal.samplers.recorded import rederive_shape_columns
        from tracecal.sql.samples import read_parquet_samples, write_samples

        # shape columns follow this version's decoder, as re-ingested operators do
        table = rederive_shape_columns(read_parquet_samples(path, cluster))
        with self.connect() as con:
            return SamplesImport(write_samples(con, table, origin=str(path)), None, None)

    def samples_list(self, *, cluster: str | None = None) -> pl.DataFrame:
        """`tracecal samples list`: samples per cluster, family, op, direction, source and devices."""
        import polars as pl

        from tracecal.sql.samples import samples_overview

        with self.connect(read_only=True) as con:
            return pl.from_arrow(samples_overview(con, cluster))  # type: ignore[return-value]

    def samples_flags(self, *, cluster: str | None = None) -> pl.DataFrame:
        """The flagged samples per cluster and reason (left out of calibration), as `samples list` shows."""
        import polars as pl

        from tracecal.sql.samples import flag_counts

        with self.connect(read_only=True) as con:
            return pl.from_arrow(flag_counts(con, cluster))  # type: ignore[return-value]

    def samples_export(self, path: str | Path, *, cluster: str | None = None) -> int:
        """`tracecal samples export -o PATH`: write samples to Parquet; returns how many."""
        from tracecal.sql.samples import export_parquet

        with self.connect(read_only=True) as con:
            return export_parquet(con, Path(path), cluster)

    def samples_flag(self, cluster: str) -> dict[str, int]:
        """`tracecal samples flag --cluster NAME`: recompute the quality flags; samples flagged per reason."""
        from tracecal.samplers.quality import reflag_cluster

        with self.connect() as con:
            return reflag_cluster(con, cluster)

    def samples_plan(
        self,
        *,
        config: str | None = None,
        from_run: str | None = None,
        dtypes: Sequence[str] | None = None,
        families: Sequence[str] | None = None,
        parts: int = 1,
        part: int = 1,
        inference: bool = False,
        exact: bool = False,
    ) -> ComputePlan:
        """`tracecal samples measure compute --plan`: the points of a grid (``config``) or of an ingested
        run's traced calls and their neighbours (``from_run``; ``exact``: the traced calls alone), with
        the share of the run's operator time they cover. Times nothing."""
        from tracecal.samplers.plan import compute_plan

        with self.connect() as con:
            return compute_plan(
                con, config=config, from_run=from_run, dtypes=dtypes, families=families, parts=parts, part=part,
                inference=inference, exact=exact,
            )  # fmt: skip

    def samples_measure_compute(
        self,
        cluster: str,
        plan: ComputePlan | None = None,
        *,
        device: str = "cpu",
        repeats: int | None = None,
        warmup: int | None = None,
        threads: int | None = None,
        timing: str | None = None,
        passes: int = 1,
        processes: int = 1,
        dry_run: bool = False,
        progress: Callable[[int, int, str], None] | None = None,
        **plan_options: Any,
    ) -> ComputeSampling:
        """`tracecal samples measure compute`: time the points of ``plan`` (else of
        ``samples_plan(**plan_options)``) that ``cluster`` has not stored yet, forward and backward,
        store the samples and re-flag the cluster's samples. ``dry_run``: only count the points left
        per family and direction."""
        from tracecal.api.sampling import measure_compute

        plan = plan if plan is not None else self.samples_plan(**plan_options)
        return measure_compute(
            self, cluster, plan, device=device, repeats=repeats, warmup=warmup, threads=threads, timing=timing,
            passes=passes, processes=processes, dry_run=dry_run, progress=progress,
        )  # fmt: skip

    def samples_measure_comm(
        self,
        cluster: str,
        *,
        world_size: int = 2,
        config: str | None = None,
        sizes: str | None = None,
        collectives: str | None = None,
        dtype: str | None = None,
        groups: str | None = None,
        repeats: int | None = None,
        warmup: int | None = None,
    ) -> CommSampling:
        """`tracecal samples measure comm`: time collectives and send/recv over a size sweep (the slowest
        rank's time is the sample) on ``world_size`` local gloo processes, or in the launcher's process
        group when this process is a torchrun rank (rank 0 writes); store and re-flag."""
        from tracecal.api.sampling import measure_comm

        return measure_comm(
            self, cluster, world_size=world_size, config=config, sizes=sizes, collectives=collectives, dtype=dtype,
            groups=groups, repeats=repeats, warmup=warmup,
        )  # fmt: skip

    # -- workload, demo -------------------------------------------------------------------------

    def workload_run(
        self, out: str | Path, config: WorkloadConfig | None = None, *, force: bool = False, **options: Any
    ) -> LocalRun:
        """`tracecal workload run --out DIR`: train the reference GPT (``config``, else a
        `tracecal.workload.WorkloadConfig` of ``options``) with pp·tp·dp local processes under
        torch.profiler, one trace per rank and ``run.json`` in ``out``. It writes no database: `ingest`
        reads the run directory next. ``force`` replaces a run already there."""
        from tracecal.workload import WorkloadConfig, run_local

        cfg = (config or WorkloadConfig(**options)).validate()
        return run_local(cfg, Path(out), force=force)

    def demo(
        self,
        directory: str | Path | None = None,
        plan: DemoPlan | None = None,
        *,
        repeats: int = 2,
        passes: int = 3,
        processes: int | None = None,
        on_start: Callable[[DemoStage], None] | None = None,
        on_done: Callable[[DemoStage, Any], None] | None = None,
        progress: Callable[[str, int, int, str], None] | None = None,
        **plan_options: Any,
    ) -> DemoReport:
        """`tracecal demo`: train the reference GPT here, ingest it into this database, sample its shapes,
        calibrate the ``local`` cluster and replay the best iteration (measured and predicted, both
        stored); the run and the figures go to ``directory`` (default: beside the database). ``plan``
        from `tracecal.api.demo.plan_demo` (else made of ``plan_options``: device, pp, tp, dp, steps,
        timing). ``on_start(stage)`` / ``on_done(stage, result)`` around each of the five stages."""
        from tracecal.api.demo import plan_demo, run_demo

        plan = plan if plan is not None else plan_demo(**plan_options)
        where = Path(directory) if directory is not None else self.db_path.absolute().parent
        return run_demo(
            self, where, plan, repeats=repeats, passes=passes, processes=processes, on_start=on_start,
            on_done=on_done, progress=progress,
        )  # fmt: skip

    # -- export, diff, search -------------------------------------------------------------------

    def export(
        self,
        run: str,
        path: str | Path,
        *,
        what: str = "measured",
        iteration: int | None = None,
        cluster: str | None = None,
        split_ranks: bool = False,
    ) -> ExportResult:
        """`tracecal export RUN -o PATH`: RUN as a Perfetto / chrome://tracing trace (measured, predicted or
        both); returns the files written, ranks and spans."""
        from tracecal.predict.export_store import WHAT, export_run

        with self.connect(read_only=True) as con:
            model = self.run_model(con, run, cluster) if what in WHAT and what != "measured" else None
            return export_run(
                con, run, Path(path), what=what, iteration=iteration, model=model, split_ranks=split_ranks
            )

    def run_model(self, con: duckdb.DuckDBPyConnection, run: str, cluster: str | None) -> DurationModel:
        """The calibrated models of ``cluster``, else of the run's own cluster."""
        from tracecal.errors import CalibrationError

        if cluster is None:
            rows = con.execute("SELECT cluster FROM runs WHERE run_id = ?", [run]).fetchall()
            if not rows:
                raise RunNotFoundError(f"no run {run!r} in the database; see `tracecal runs`")
            cluster = rows[0][0]
            if not cluster:
                raise CalibrationError(
                    f"run {run} has no cluster: pass --cluster NAME (models from `calibrate --cluster NAME`)"
                )
        return self.duration_model(con, cluster)

    def diff(
        self, run_a: str, run_b: str | None = None, *, by: str = "family", predicted: bool = False,
        cluster: str | None = None,
    ) -> pl.DataFrame:  # fmt: skip
        """`tracecal diff A B` (or `diff A --predicted`): time per group in A and B, B − A and its share of
        the iteration difference, largest movers first."""
        return self.diff_report(run_a, run_b, by=by, predicted=predicted, cluster=cluster).table

    def diff_report(
        self, run_a: str, run_b: str | None = None, *, by: str = "family", predicted: bool = False,
        cluster: str | None = None,
    ) -> Diff:  # fmt: skip
        from tracecal.predict.diff_store import diff_predicted, diff_runs

        if predicted == (run_b is not None):
            raise PredictionError("give two runs (tracecal diff A B), or one run and --predicted")
        with self.connect(read_only=True) as con:
            if predicted:
                return diff_predicted(con, run_a, self.run_model(con, run_a, cluster), by)
            return diff_runs(con, run_a, run_b or "", by)

    def search(
        self,
        run: str,
        *,
        gpus: int,
        cluster: str | None = None,
        mode: str = "predicted",
        gpus_per_node: int | None = None,
        micro_batches: int | None = None,
        micro_batch_size: int | None = None,
        gpu_memory_gib: float | None = None,
    ) -> pl.DataFrame:
        """`tracecal search RUN --gpus N`: the valid layouts of N GPUs ranked by predicted throughput."""
        return self.search_report(
            run, gpus=gpus, cluster=cluster, mode=mode, gpus_per_node=gpus_per_node, micro_batches=micro_batches,
            micro_batch_size=micro_batch_size, gpu_memory_gib=gpu_memory_gib,
        )[0].table  # fmt: skip

    def search_report(
        self,
        run: str,
        *,
        gpus: int,
        cluster: str | None = None,
        mode: str = "predicted",
        gpus_per_node: int | None = None,
        micro_batches: int | None = None,
        micro_batch_size: int | None = None,
        gpu_memory_gib: float | None = None,
        progress: Callable[[Any, int, int], None] | None = None,
    ) -> tuple[SearchResult, str]:
        """The search result and where the memory limit per GPU came from."""
        from tracecal.predict.search import device_memory_bytes, search_run

        with self.connect() as con:
            model = self._predicted_model(con, mode, cluster, _LAYOUT_NEEDS_CLUSTER)
            memory: float | None
            if gpu_memory_gib is not None:
                memory, memory_source = gpu_memory_gib * 2**30, f"{gpu_memory_gib:g} GiB (--gpu-memory-gib)"
            else:
                memory, memory_source = device_memory_bytes(con, cluster)
            result = search_run(
                con, run, gpus, scratch=self.scratch_database, model=model, mode=mode, gpus_per_node=gpus_per_node,
                micro_batches=micro_batches, micro_batch_size=micro_batch_size, memory_bytes=memory,
                progress=progress,
            )  # fmt: skip
        return result, memory_source

    def predict_layout(
        self,
        run: str,
        layout: str | None = None,
        *,
        cluster: str | None = None,
        mode: str = "predicted",
        micro_batches: int | None = None,
        micro_batch_size: int | None = None,
        gpus_per_node: int | None = None,
        replay: str = "fitted",
    ) -> LayoutPrediction:
        """`tracecal predict RUN --layout PPxTPxDP`: rebuild RUN's iteration at another layout (``None``:
        the run's own PP, TP and DP with other micro-batches) and replay it; stores nothing."""
        from tracecal.predict.layouts import Layout, parse_layout
        from tracecal.predict.relayout_run import predict_layout, run_layout

        with self.connect() as con:
            if layout is None:
                own = run_layout(con, run)
                pp, tp, dp = own.pp, own.tp, own.dp
            else:
                pp, tp, dp = parse_layout(layout)
            target = Layout(pp, tp, dp, micro_batches, micro_batch_size, gpus_per_node)
            model = self._predicted_model(con, mode, cluster, _LAYOUT_NEEDS_CLUSTER)
            return predict_layout(
                con, run, target, scratch=self.scratch_database, mode=mode, model=model, replay=replay
            )


def component_table_ms(pred: Prediction) -> pl.DataFrame:
    """The user-facing table of a prediction: rank, component, measured_ms, predicted_ms, error_pct,
    covered_share, dependency_error_pct, unexplained_pct."""
    import polars as pl

    from tracecal.predict.run import slack_report

    return pred.components.select(
        "rank",
        "component",
        (pl.col("measured_ns") / 1e6).alias("measured_ms"),
        (pl.col("predicted_ns") / 1e6).alias("predicted_ms"),
        "error_pct",
        "covered_share",
    ).join(slack_report(pred), on=["rank", "component"], how="left", maintain_order="left")


def default_runs(con: duckdb.DuckDBPyConnection, cluster: str | None) -> list[str]:
    """The runs `validate` scores by default: the cluster's, else all."""
    rows = con.execute(
        "SELECT run_id FROM runs WHERE ? IS NULL OR cluster = ? ORDER BY run_id", [cluster, cluster]
    ).fetchall()
    if not rows:
        rows = con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()
    if not rows:
        raise RunNotFoundError("no runs in the database; ingest some with trace-ingest RUN_DIR")
    return [r[0] for r in rows]


def _published_attribution(con: duckdb.DuckDBPyConnection, results: list[PublishedValidation]) -> list[pl.DataFrame]:
    """Each decoded run's Table 9 cells, their error split by the schedule and the op families, with the
    published error beside them."""
    from tracecal.predict.attribution import as_percent
    from tracecal.sources.gpumodeling25.validate.attribution import published_attribution
    from tracecal.sources.gpumodeling25.validate.module_times import module_members
    from tracecal.sources.gpumodeling25.validate.published_runs import traced_ranks

    frames = []
    for v in results:
        members = module_members(con, v.run_id, v.stored.iteration)
        cells = published_attribution(v.prediction, members, traced_ranks(con, v.run_id), v.components)
        published = v.components.select("run_id", "component", "published_error_pct")
        frames.append(as_percent(cells).join(published, on=["run_id", "component"], how="left"))
    return frames


def _cross_cluster_ratios(con: duckdb.DuckDBPyConnection, run: str, source: str | None, target: str | None) -> dict:
    """Family -> ``what_if.ClusterRatio`` for a run predicted with another cluster's models (empty on
    its own cluster, or when the run's cluster is unknown)."""
    from tracecal.predict.what_if import cluster_ratios, sample_rates

    if source is None or target is None or source == target:
        return {}
    families = [r[0] for r in con.execute("SELECT DISTINCT family FROM operators WHERE run_id = ?", [run]).fetchall()]
    return cluster_ratios(sample_rates(con, source, target), source, target, [*families, "comm"])


def _check_dask_installed() -> None:
    """Before anything is opened: without Dask, ``dask=`` is one line saying how to get it."""
    from tracecal.ingest.dask_cluster import INSTALL_HINT

    try:
        import distributed  # noqa: F401
    except ImportError:
        raise TracecalError(INSTALL_HINT) from None

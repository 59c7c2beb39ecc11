"""`tracecal export`: read a stored run (and its replay), convert it (``tracecal.predict.export``), write it.

One file (``.json`` or ``.json.gz``) holds every rank, one process each (named ``rank N``), for
ui.perfetto.dev; a directory (``split_ranks``) holds one Kineto trace per rank and ``run.json``.
``trace-ingest`` reads either back as the same run (a file's ``rank N`` processes are its ranks:
``tracecal.sources.kineto.parser.ranks_of_processes``); only the split form carries the layout.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import duckdb
import polars as pl

from tracecal.errors import InputNotFoundError, PredictionError, RunNotFoundError
from tracecal.predict import export as ex
from tracecal.predict.durations import DurationModel
from tracecal.predict.run import Prediction
from tracecal.predict.store import predict_stored_run
from tracecal.sql.connection import query_arrow
from tracecal.sql.query import parse_run_metadata
from tracecal.sql.query_files import query_frame

WHAT = ("measured", "predicted", "both")
"""What ``export_run`` writes: the stored timeline, the replayed one, or both side by side."""


@dataclass(frozen=True)
class ExportResult:
    """What was written: the files, the iteration (None: the whole run), spans and flows per timeline,
    and the ``TrackReport`` of the nesting fix."""

    files: list[Path]
    iteration: int | None
    spans: int
    ranks: int
    tracks: ex.TrackReport
    prediction: Prediction | None


def export_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    output: Path,
    *,
    what: str = "measured",
    iteration: int | None = None,
    model: DurationModel | None = None,
    split_ranks: bool = False,
) -> ExportResult:
    """Write the trace of ``run_id``.

    Args:
        what: ``measured`` (the stored events: the whole run, or ``iteration``), ``predicted`` (the
            replay of ``iteration``, default the best, with ``model``'s durations) or ``both``
            (the measured events of that iteration and its replay, a second process per rank).
        output: a ``.json`` / ``.json.gz`` file, or with ``split_ranks`` a directory (made if needed).
        model: the calibrated duration model (required for ``predicted`` and ``both``).

    Raises:
        RunNotFoundError: no such run. PredictionError: unknown ``what`` or iteration, a missing
        model, or nothing to export. InputNotFoundError: the output cannot be written.
    """
    if what not in WHAT:
        raise PredictionError(f"unknown --what {what!r}; use one of {', '.join(WHAT)}")
    _check_output(output, split_ranks)
    run = _run_row(con, run_id)
    prediction = None
    if what != "measured":
        if model is None:
            raise PredictionError(f"--what {what} needs calibrated models: run `calibrate --cluster NAME` first")
        stored, prediction = predict_stored_run(con, run_id, mode="predicted", model=model, iteration=iteration)
        iteration = stored.iteration
    elif iteration is not None:
        _check_iteration(con, run_id, iteration)
    ranks = _ranks(con, run_id)
    parts = []
    if what != "predicted":
        events = _events(con, run_id, iteration)
        if prediction is not None:
            events = events.join(_operator_predictions(prediction), on=["rank", "event_id"], how="left")
        parts.append(ex.measured_spans(events))
    if prediction is not None:
        offsets = dict(ranks.select("rank", pl.col("clock_offset_ns").fill_null(0)).iter_rows())
        parts.append(
            ex.graph_spans(
                prediction.graph,
                prediction.replayed,
                offsets=offsets,
                predicted=True,
                annotations=_node_annotations(prediction),
            )
        )
    spans = pl.concat(parts, how="diagonal_relaxed")
    if spans.height == 0:
        raise PredictionError(f"run {run_id} has nothing to export")
    spans, tracks, report = ex.assign_tracks(spans)
    header = _header(run, ranks)
    if split_ranks:
        files = _write_split(output, spans, tracks, header, ranks, run)
    else:
        if ranks.height == 1:
            header["distributedInfo"] = {**header["distributedInfo"], "rank": int(ranks["rank"][0])}
        write_trace(output, ex.trace_json(spans, tracks, header))
        files = [output]
    return ExportResult(
        files=files,
        iteration=iteration,
        spans=spans.height,
        ranks=ranks.height,
        tracks=report,
        prediction=prediction,
    )


def _umask() -> int:
    """The process's umask (read by setting it, then put back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_trace(path: Path, pieces: Iterable[bytes | pl.Series]) -> None:
    """Write the pieces (``trace_json``'s: bytes or a Series of lines) to ``path`` (gzip when it ends in
    ``.gz``) through a temporary file renamed into place, so a failure leaves no partial trace.

    Raises:
        InputNotFoundError: the file cannot be written.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise InputNotFoundError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as raw:
            sink: Any = _gzip_writer(raw) if path.suffix == ".gz" else raw
            for piece in pieces:
                if isinstance(piece, pl.Series):
                    ex.write_lines(sink, piece)
                else:
                    sink.write(piece)
            if sink is not raw:
                sink.close()
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; the trace gets a normal file's mode
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputNotFoundError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _gzip_writer(raw: Any) -> Any:
    """A fast gzip stream: ISA-L's deflate when installed, else zlib at level 1 (a trace is written once)."""
    try:
        from isal import igzip

        return igzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1)
    except ImportError:
        return gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1)


def _check_output(output: Path, split_ranks: bool) -> None:
    if split_ranks:
        if output.exists() and not output.is_dir():
            raise InputNotFoundError(f"--split-ranks writes a directory, and {output} is a file")
        return
    if not output.name.endswith((".json", ".json.gz")):
        raise InputNotFoundError(
            f"--output {output}: name a .json or .json.gz file (or a directory with --split-ranks)"
        )
    if output.is_dir():
        raise InputNotFoundError(f"--output {output} is a directory")


def _run_row(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    frame = cast(pl.DataFrame, pl.from_arrow(query_arrow(con, "SELECT * FROM runs WHERE run_id = ?", [run_id])))
    if frame.height == 0:
        known = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        raise RunNotFoundError(
            f"no run {run_id!r} in the database (runs: {', '.join(known) or 'none'}); ingest it with trace-ingest"
        )
    return frame.row(0, named=True)


def _check_iteration(con: duckdb.DuckDBPyConnection, run_id: str, iteration: int) -> None:
    rows = con.execute("SELECT 1 FROM iterations WHERE run_id = ? AND iteration = ? LIMIT 1", [run_id, iteration])
    if not rows.fetchall():
        raise PredictionError(f"run {run_id} has no iteration {iteration}; see `tracecal iterations {run_id}`")


def _ranks(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    sql = "SELECT rank, clock_offset_ns, backend, host, device_name FROM ranks WHERE run_id = ? ORDER BY rank"
    return cast(pl.DataFrame, pl.from_arrow(query_arrow(con, sql, [run_id])))


def _events(con: duckdb.DuckDBPyConnection, run_id: str, iteration: int | None) -> pl.DataFrame:
    return query_frame(con, "export_events", [run_id, iteration]).drop("run_id")


def _operator_predictions(prediction: Prediction) -> pl.DataFrame:
    """Per operator (rank, event_id): its replayed duration and where its duration came from."""
    return prediction.predictions.select(
        pl.col("rank").cast(pl.Int32), "event_id", "predicted_dur_ns", "duration_source"
    ).unique(["rank", "event_id"], keep="first")


def _node_annotations(prediction: Prediction) -> pl.DataFrame:
    """Per activity node of the replay: phase, measured and predicted duration, their source."""
    nodes = prediction.graph.nodes
    acts = nodes.filter(pl.col("node_kind") == "activity").select("node", "rank", "event_id", "dur_ns")
    preds = _operator_predictions(prediction).with_columns(pl.col("rank").cast(pl.Int64))
    out = acts.join(preds, on=["rank", "event_id"], how="left").select(
        "node", pl.col("dur_ns").alias("measured_dur_ns"), "predicted_dur_ns", "duration_source"
    )
    features = prediction.graph.features
    if "phase" in features.columns:
        out = out.join(features.select("node", "phase"), on="node", how="left")
    return out


def _header(run: dict[str, Any], ranks: pl.DataFrame) -> dict[str, Any]:
    """Top-level keys: Kineto's ``distributedInfo`` (rank added per file) and the run's name."""
    backends = [b for b in ranks["backend"].unique().to_list() if b]
    info: dict[str, Any] = {"world_size": run["world_size"] or ranks.height}
    if len(backends) == 1:
        info["backend"] = backends[0]
    return {"schemaVersion": 1, "traceName": f"tracecal export of {run['run_id']}", "distributedInfo": info}


def _write_split(
    directory: Path,
    spans: pl.DataFrame,
    tracks: pl.DataFrame,
    header: dict[str, Any],
    ranks: pl.DataFrame,
    run: dict[str, Any],
) -> list[Path]:
    """One Kineto trace per rank (``rank{N}.pt.trace.json.gz``) and ``run.json`` with the run's layout."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputNotFoundError(f"cannot write {directory}: {exc.strerror or exc}") from exc
    files = []
    for rank in ranks["rank"].to_list():
        own = spans.filter(pl.col("rank") == rank)
        if own.height == 0:
            continue
        rank_header = {**header, "distributedInfo": {**header["distributedInfo"], "rank": int(rank)}}
        path = directory / f"rank{rank}.pt.trace.json.gz"
        write_trace(path, ex.trace_json(own, tracks.filter(pl.col("rank") == rank), rank_header, flows=False))
        files.append(path)
    metadata = parse_run_metadata(run.get("metadata_json"))
    for key in ("model", "pp", "tp", "dp", "nodes", "gpus_per_node"):
        if run.get(key) is not None:
            metadata[key] = run[key]
    run_json = directory / "run.json"
    write_trace(run_json, [json.dumps(metadata, indent=1).encode() + b"\n"])
    files.append(run_json)
    return files

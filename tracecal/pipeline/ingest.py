"""Ingesting runs: discover, parse and decode each rank in workers, insert, finish, one transaction per run.

``ingest_runs(con, run_dirs, options) -> IngestReport`` is the library side of ``trace-ingest``.
Files go to an executor (``tracecal.ingest.executors``: this process, a process pool, or a Dask
cluster; at most ``capacity`` files in flight) that parses each one into Parquet shards and decodes
its ranks there (``tracecal.pipeline.rank_decode``). As each rank arrives, its operators are inserted
and its events' Parquet shard is moved into the event store beside the database
(``tracecal.sql.event_store``: the ``events`` view reads it there, so no event is inserted), so
neither a worker nor the loader ever holds a whole run. Shards live in a directory made for the
ingest and removed after it. The first files parse while the run's transaction opens. Each run is
one DuckDB transaction: its old rows are deleted from every run table, the new ones inserted, the
``events`` view switched to the run's new folder of event files, decoding finished
(``tracecal.pipeline.decode``: the cross-rank steps), and any failure rolls back so the database is
unchanged (and the new event files are deleted; those a commit replaced are deleted after it). The
statements are ``tracecal.sql.loaders``'s.

Which files are a run's rank files, and whose reader parses them, the source registry says
(``tracecal.sources.registry``); a run that is a folder of tables rather than rank files is rebuilt into
ranks by its folder source (``FolderRun``) in this process. No format is named here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from tracecal import __version__
from tracecal.decode.iterations import DEFAULT_MARKER
from tracecal.errors import RankConflictError, TracecalError
from tracecal.ingest.discover import (
    DiscoveredRun,
    TraceFile,
    discover_run,
    layout_from_process_groups,
    missing_ranks,
    resolve_rank,
    world_size_of,
)
from tracecal.ingest.executors import FileExecutor, InProcess, OnError, Parsing, ProcessPool, Skipped
from tracecal.ingest.parse import read_run_folder
from tracecal.ingest.shards import count_kernels, write_shard
from tracecal.ingest.trace import EventsFile, FolderRun, ParsedRank
from tracecal.pipeline.decode import DecodeSummary, JustStored, RankParts, check_marker, decode_stored_run
from tracecal.pipeline.rank_decode import DecodedRank, DecodePlan, parse_and_decode
from tracecal.schema import RANKS, RUNS, arrow_schema
from tracecal.sql.event_store import EventStore, keep_file, rank_file, refresh_events_view
from tracecal.sql.loaders import (
    OneThreadForLargeInserts,
    delete_rank_operators,
    delete_run,
    insert_operators_file,
    insert_rows,
    set_ingest_seconds,
)
from tracecal.vocabulary import ParallelLayout


@dataclass(frozen=True)
class IngestOptions:
    """How to ingest: resolved once by the caller (CLI flags) and passed down.

    Attributes:
        run_id: id of the run; only with a single run directory (default: the directory name).
        workers: worker processes that parse (at most this many files in flight) while this
            process loads; a run of a single file parses in this process unless ``dask`` is set.
            With ``dask="local"``, the number of Dask workers.
        on_error: ``raise`` stops at the first bad file (the run is rolled back); ``skip`` leaves
            the file (or a run whose every file failed) out and reports it.
        cluster: cluster the run was taken on, stored in ``runs.cluster``.
        iteration_marker: regex of the iteration marker for decoding (default ``ProfilerStep#N``).
        layout: PP/TP/DP/nodes/GPUs-per-node given as flags; fields left None are detected.
        dask: parse on Dask: ``local`` (a ``LocalCluster`` of ``workers`` workers) or a scheduler
            address; None parses locally.
        shard_dir: where the ingest's temporary directory of Parquet shards is made (default: the
            system's temporary directory); with a remote ``dask`` scheduler it must be a filesystem
            the workers share with this process.
    """

    run_id: str | None = None
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    on_error: OnError = "raise"
    cluster: str | None = None
    iteration_marker: str | None = None
    layout: ParallelLayout | None = None
    dask: str | None = None
    shard_dir: Path | None = None


@dataclass(frozen=True)
class RunReport:
    """What one run's ingest stored and how long it took."""

    run_id: str
    source_path: Path
    format: str
    ranks: int
    world_size: int
    events: int
    kernels: int
    input_bytes: int
    source_bytes: int
    seconds: float
    load_seconds: float
    missing_ranks: tuple[int, ...]
    layout: ParallelLayout
    skipped: tuple[Skipped, ...] = ()
    decode: DecodeSummary | None = None
    warnings: tuple[str, ...] = ()
    """Parser warnings (``ParsedRank.metadata['warnings']``, e.g. an Nsight export without kernels), deduplicated."""
    files_read: int = 0
    """Files read: the rank files parsed, or those a folder source read (``FolderRun.read``)."""
    table_rows: int | None = None
    """The table rows a folder source read (None for rank files: their rows are ``events``)."""

    @property
    def mb_per_s(self) -> float:
        """Throughput in MB (10^6 bytes) of uncompressed trace per second of the whole ingest."""
        return self.source_bytes / 1e6 / self.seconds if self.seconds > 0 else float("nan")

    @property
    def decode_seconds(self) -> float:
        """Time spent deriving operators, collectives and iterations (the rest is parse + load)."""
        return self.seconds - self.load_seconds


@dataclass(frozen=True)
class IngestReport:
    """Every run ingested, every file or run skipped, and the total wall time."""

    runs: tuple[RunReport, ...]
    skipped: tuple[Skipped, ...]
    seconds: float


@dataclass(frozen=True)
class Progress:
    """Sent to the progress callback after each file of a run is parsed (or skipped)."""

    run_id: str
    file: Path | None
    files_done: int
    files_total: int


ProgressCallback = Callable[[Progress], None]


def ingest_runs(
    con: duckdb.DuckDBPyConnection,
    run_dirs: Sequence[Path],
    options: IngestOptions | None = None,
    progress: ProgressCallback | None = None,
    executor: FileExecutor | None = None,
) -> IngestReport:
    """Ingest each run directory into the database, one transaction per run.

    All runs are discovered before anything is written, so a bad path fails before any change.
    ``executor``: where files are parsed (e.g. a ``DaskExecutor`` over the caller's own client; the
    caller closes it); by default one is made from ``options.workers`` and ``options.dask``.

    Raises:
        InputNotFoundError: a path does not exist, is empty, or holds no trace files
            (under ``on_error="skip"`` such a run is reported as skipped instead).
        TraceFormatError: a file is not a readable trace (``raise`` mode).
        RankConflictError: two files claim the same rank, or a file's rank cannot be determined.
        WorkerError: a parser process (or Dask worker) died.
    """
    options = options or IngestOptions()
    started = time.perf_counter()
    if options.run_id is not None and len(run_dirs) != 1:
        raise TracecalError("--run-id names a single run; give one RUN directory or omit --run-id")
    skipped: list[Skipped] = []
    discovered: list[tuple[str, DiscoveredRun]] = []
    for run_dir in run_dirs:
        try:
            run = discover_run(Path(run_dir), options.layout)
        except TracecalError as exc:
            if options.on_error == "raise":
                raise
            skipped.append(Skipped(Path(run_dir), str(exc)))
            continue
        run_id = options.run_id or run.name
        clash = next((other for rid, other in discovered if rid == run_id), None)
        if clash is not None and clash.run_dir == run.run_dir:
            skipped.append(Skipped(Path(run_dir), f"{run.run_dir} was given more than once; it is ingested once"))
            continue
        if clash is not None:
            raise TracecalError(
                f"{run.run_dir} and {clash.run_dir} would both be run {run_id!r}; ingest them separately with --run-id"
            )
        discovered.append((run_id, run))
    reports = []
    if discovered:
        EventStore(con).remove_orphans()
    with _Executors(options, executor) as executors:
        for run_id, run in discovered:
            try:
                reports.append(_ingest_run(con, run_id, run, options, executors, progress))
            except _NothingLeft as exc:
                if options.on_error == "raise":
                    raise
                skipped.append(Skipped(run.run_dir, str(exc)))
    return IngestReport(tuple(reports), tuple(skipped), time.perf_counter() - started)


class _Executors:
    """The executors of one ingest and its shard directory, made when first needed, closed at the end."""

    def __init__(self, options: IngestOptions, given: FileExecutor | None) -> None:
        self.options, self.given = options, given
        self.made: FileExecutor | None = None
        self.shard_dir: Path | None = None

    def __enter__(self) -> _Executors:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.made is not None:
                self.made.close()
        finally:
            if self.shard_dir is not None:
                shutil.rmtree(self.shard_dir, ignore_errors=True)

    def shards(self) -> Path:
        """This ingest's shard directory (removed at the end with whatever a failed run left there)."""
        if self.shard_dir is None:
            parent = self.options.shard_dir
            if parent is not None:
                parent.mkdir(parents=True, exist_ok=True)
            self.shard_dir = Path(tempfile.mkdtemp(prefix="tracecal-shards-", dir=parent))
        return self.shard_dir

    def for_files(self, files: int) -> FileExecutor:
        """Dask or the caller's executor when given; else this process for a run of one file (nothing
        to overlap), and the process pool (started on first use) otherwise: with ``--workers 1`` too,
        so that one worker parses the next file while this process loads the last."""
        if self.given is not None:
            return self.given
        if self.options.dask is None and files <= 1:
            return InProcess()
        if self.made is None:
            if self.options.dask is not None:
                from tracecal.ingest.dask_cluster import dask_executor

                self.made = dask_executor(self.options.dask, self.options.workers)
            else:
                self.made = ProcessPool(self.options.workers)
        return self.made


class _NothingLeft(TracecalError):
    """Every file of a run was skipped: the run itself is skipped."""


def _ingest_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    run: DiscoveredRun,
    options: IngestOptions,
    executors: _Executors,
    progress: ProgressCallback | None,
    rebuilt: FolderRun | None = None,
) -> RunReport:
    started = time.perf_counter()
    check_marker(options.iteration_marker)  # before any worker decodes with it
    skipped: list[Skipped] = []
    if rebuilt is None and run.folder is not None:
        try:  # a folder source rebuilds the whole run here; rank files are parsed by the workers below
            rebuilt = read_run_folder(run.format, run.folder, run.layout)
        except TracecalError as exc:
            if options.on_error == "raise":
                raise
            raise _NothingLeft(str(exc)) from exc  # skip mode: the run is reported as skipped
    if rebuilt is not None:
        run = replace(run, layout=rebuilt.layout.merged(run.layout), files=_rebuilt_files(rebuilt))
    store = EventStore(con)
    # Workers parse and decode each rank of the files; the first start now, while this process opens
    # the transaction.
    plan = DecodePlan(run.layout, options.iteration_marker, len(run.files))
    parsing: Iterator[tuple[TraceFile, Sequence[ParsedRank | DecodedRank]]] = (
        _rebuilt_ranks(run, rebuilt)
        if rebuilt is not None
        else Parsing(
            executors.for_files(len(run.files)),
            run.files,
            executors.shards(),
            options.on_error,
            skipped,
            task=partial(parse_and_decode, plan=plan),
        )
    )
    began = False
    try:
        con.execute("BEGIN TRANSACTION")
        began = True
        # Step 1: re-ingest replaces — the run's rows go from every run-keyed table; its event files
        # go once the new ones are committed.
        store.replace_run(run_id)
        delete_run(con, run_id)
        stored = _StoredRanks(con, run_id, len(run.files), store.new_run_dir(run_id))

        # Step 2: parse files in parallel; store each rank as it arrives (its events into the run's
        # folder, its operators inserted), then drop it. DuckDB on one thread from the first large
        # rank to the end of decode (decode's inserts too).
        try:
            for done, (trace_file, parsed) in enumerate(parsing, start=1):
                stored.add(trace_file, parsed)
                del parsed
                if progress is not None:
                    progress(Progress(run_id, trace_file.path, done, len(run.files)))
            if not stored.rows:
                reasons = "; ".join(s.reason for s in skipped[:3])
                raise _NothingLeft(f"{run.run_dir}: every trace file failed ({reasons})")

            # Step 3: the run and its ranks.
            world_size = world_size_of(stored.world_sizes, len(stored.rows))
            layout = run.layout
            if not layout.known:
                layout = (layout_from_process_groups(stored.process_groups) or ParallelLayout()).merged(layout)
            insert_rows(con, RANKS.name, arrow_schema(RANKS), [{**r, "run_id": run_id} for r in stored.rows])
            load_seconds = time.perf_counter() - started
            events_dir = store.relative(stored.run_dir)
            row = _run_row(run_id, run, options, layout, world_size, len(stored.rows), load_seconds, events_dir)
            insert_rows(con, RUNS.name, arrow_schema(RUNS), [row])
            refresh_events_view(con)
            run_layout = replace(layout, world_size=world_size)

            # Step 4: the cross-rank half of decoding (and the per-rank half of the ranks no worker
            # decoded, or decoded with a layout the whole run contradicts) inside the run's transaction.
            decoded = decode_stored_run(
                con,
                run_id,
                iteration_marker=options.iteration_marker,
                stored=JustStored(run_layout, stored.decoded_with(run_layout)),
            )
        finally:
            stored.threads.restore()

        seconds = time.perf_counter() - started
        set_ingest_seconds(con, run_id, seconds)
        con.execute("COMMIT")
        store.after_commit()
    except BaseException:
        if began:
            con.execute("ROLLBACK")
        store.after_rollback()
        raise
    finally:
        if isinstance(parsing, Parsing):
            parsing.close()  # after an error: the files not yet started are cancelled
    read = rebuilt.read if rebuilt is not None else None
    return RunReport(
        run_id=run_id,
        source_path=run.run_dir,
        format=run.format,
        ranks=len(stored.rows),
        world_size=world_size,
        events=stored.events,
        kernels=stored.kernels,
        input_bytes=read.bytes if read else sum(f.size_bytes for f in run.files),
        source_bytes=read.bytes if read else stored.source_bytes,
        files_read=len(read.paths) if read else len(run.files) - len(skipped),
        table_rows=read.table_rows if read else None,
        seconds=seconds,
        load_seconds=load_seconds,
        missing_ranks=() if rebuilt is not None else tuple(missing_ranks(sorted(stored.owners), world_size)),
        layout=layout,
        skipped=tuple(skipped),
        warnings=tuple(stored.notes) + (tuple(rebuilt.notes) if rebuilt is not None else ()),
        decode=decoded,
    )


class _StoredRanks:
    """The ranks of one run stored so far: their event files in ``run_dir`` (the run's folder of the
    event store), their ``ranks`` rows, the totals of the run, and the per-rank decode of the ranks a
    worker decoded (``decoded``: operators stored, parts kept)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, files: int, run_dir: Path) -> None:
        self.con, self.run_id, self.files, self.run_dir = con, run_id, files, run_dir
        self.rows: list[dict[str, Any]] = []
        self.owners: dict[int, Path] = {}
        self.world_sizes: list[int | None] = []
        self.process_groups: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.events = self.kernels = self.source_bytes = 0
        self.decoded: dict[int, tuple[ParallelLayout, RankParts]] = {}
        self.threads = OneThreadForLargeInserts(con)

    def add(self, trace_file: TraceFile, parsed: Sequence[ParsedRank | DecodedRank]) -> None:
        """Store the events of every rank of one file in the event store, and the operators of
        those a worker decoded.

        Raises:
            RankConflictError: a rank is already held by another file, or cannot be determined.
        """
        for result in parsed:
            if isinstance(result, DecodedRank):
                rank_trace, rank, rank_source = result.parsed, result.rank, result.rank_source
            else:
                rank_trace = result
                rank, rank_source = resolve_rank(trace_file, rank_trace, len(parsed), self.files)
            if rank in self.owners:
                raise RankConflictError(
                    f"{trace_file.path} and {self.owners[rank]} both hold rank {rank}; "
                    "remove the duplicate or ingest them as separate runs"
                )
            self.owners[rank] = trace_file.path
            self._keep(rank_trace.events, rank)
            if isinstance(result, DecodedRank):
                try:
                    insert_operators_file(self.con, result.operators, self.run_id)
                finally:
                    result.operators.unlink(missing_ok=True)
                self.decoded[rank] = (result.layout, result.parts)
            row = _rank_row(rank, rank_trace)
            self.rows.append({**row, "rank_source": rank_source})
            self.events += row["events"]
            self.kernels += row["kernels"]
            self.source_bytes += rank_trace.source_bytes or rank_trace.file_bytes
            self.world_sizes.append(rank_trace.world_size)
            self.process_groups.extend(rank_trace.process_groups)
            self.notes.extend(w for w in rank_trace.metadata.get("warnings", ()) if w not in self.notes)

    def _keep(self, events: pa.Table | EventsFile, rank: int) -> None:
        """Put a rank's events in the run's folder of the event store: its parser's Parquet file moved
        there, or its table written there."""
        target = rank_file(self.run_dir, rank)
        if isinstance(events, EventsFile):
            self.threads.before_insert(events.rows)  # the run's decode inserts on one thread from here on
            keep_file(events.path, target)
        else:
            write_shard(events, target)

    def decoded_with(self, layout: ParallelLayout) -> dict[int, RankParts]:
        """The per-rank decode of the ranks a worker decoded with ``layout`` (what decode reads of it:
        pp, tp, dp, world size); the operators of the others are deleted, for decode to redo them."""
        same = {
            rank: parts
            for rank, (assumed, parts) in self.decoded.items()
            if (assumed.pp, assumed.tp, assumed.dp, assumed.world_size)
            == (layout.pp, layout.tp, layout.dp, layout.world_size)
        }
        again = sorted(set(self.decoded) - set(same))
        if again:
            delete_rank_operators(self.con, self.run_id, again)
        return same


INGEST_THREADS = 1
"""DuckDB threads for a connection opened only to ingest (``trace-ingest``: ``open_database(...,
threads=INGEST_THREADS)``): its inserts from Arrow, and decode's, cost less CPU on one thread (see
``tracecal.sql.loaders.OneThreadForLargeInserts``), while the other cores parse; it is set when
connecting because changing it on an open connection has a cost in every run."""


def ingest_folder_run(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    rebuilt: FolderRun,
    format_name: str,
    folder: Path,
    options: IngestOptions | None = None,
) -> RunReport:
    """Store a run a folder source already rebuilt for the caller (e.g. a decoded run at another
    parallel layout) as run ``run_id`` of format ``format_name``, decoded like ``ingest_runs`` decodes a
    run folder it discovers. ``folder``: the folder it was read from (the ranks' source path)."""
    run = DiscoveredRun(run_dir=folder, files=(), layout=rebuilt.layout, folder=folder, folder_format=format_name)
    options = options or IngestOptions()
    with _Executors(options, None) as executors:
        return _ingest_run(con, run_id, run, options, executors, None, rebuilt=rebuilt)


def _rebuilt_files(rebuilt: FolderRun) -> tuple[TraceFile, ...]:
    """One pseudo trace file per rebuilt rank (the file or folder its source names for it)."""
    return tuple(TraceFile(path=r.file, format=r.format, path_rank=r.rank, size_bytes=0) for r in rebuilt.ranks)


def _rebuilt_ranks(run: DiscoveredRun, rebuilt: FolderRun) -> Iterator[tuple[TraceFile, list[ParsedRank]]]:
    return zip(run.files, ([r] for r in rebuilt.ranks), strict=True)


def _rank_row(rank: int, parsed: ParsedRank) -> dict[str, Any]:
    """The ``ranks`` row of one parsed rank (without ``run_id`` and ``rank_source``)."""
    if isinstance(parsed.events, EventsFile):
        rows, kernels = parsed.events.rows, parsed.events.kernels
    else:
        rows, kernels = parsed.events.num_rows, count_kernels(parsed.events)
    return {
        "rank": rank,
        "file": str(parsed.file),
        "file_bytes": parsed.file_bytes,
        "host": parsed.host,
        "pid": parsed.pid,
        "device_name": parsed.device_name,
        "backend": parsed.backend,
        "schema_era": parsed.schema_era,
        "events": rows,
        "kernels": kernels,
    }


def _iteration_marker(options: IngestOptions) -> str:
    """The marker the run's iterations are delimited by (decode's default when none is given)."""
    return options.iteration_marker or DEFAULT_MARKER


def _run_row(
    run_id: str,
    run: DiscoveredRun,
    options: IngestOptions,
    layout: ParallelLayout,
    world_size: int,
    ranks_found: int,
    seconds: float,
    events_dir: str,
) -> dict[str, Any]:
    """The ``runs`` row; ``events_dir``: the run's folder of the event store, relative to the database's."""
    return {
        "run_id": run_id,
        "name": run.name,
        "source_path": str(run.run_dir),
        "format": run.format,
        "cluster": options.cluster,
        "model": layout.model,
        "pp": layout.pp,
        "tp": layout.tp,
        "dp": layout.dp,
        "nodes": layout.nodes,
        "gpus_per_node": layout.gpus_per_node,
        "world_size": world_size,
        "ranks_found": ranks_found,
        "layout_source": layout.source,
        "iteration_marker": _iteration_marker(options),
        "metadata_json": json.dumps(layout.metadata) if layout.metadata is not None else None,
        "input_bytes": run.input_bytes,
        "ingest_seconds": seconds,
        "ingested_at": datetime.now(timezone.utc).replace(tzinfo=None),
        "tool_version": __version__,
        "events_dir": events_dir,
    }

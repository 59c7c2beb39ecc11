"""Parsing in worker processes and in this process: the same rows, files in flight, a worker that dies,
skip mode, bad input as one line."""

from __future__ import annotations

import concurrent.futures
import gzip
import os
import shutil
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import KINETO, without_progress
from tracecal.cli.main import app
from tracecal.errors import TraceFormatError, WorkerError
from tracecal.ingest import shards
from tracecal.ingest.discover import discover_run
from tracecal.ingest.executors import InProcess, Parsing, ProcessPool, Skipped
from tracecal.ingest.trace import EventsFile, ParsedRank
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sql.connection import open_database

DLRM = KINETO / "dlrm_8rank"
FILES = discover_run(DLRM).files
RUN_TABLES = ("runs", "ranks", "events", "operators", "collectives", "iterations")
VARYING = {"runs": ["ingest_seconds", "ingested_at", "events_dir"]}
"""Columns that legitimately differ between two ingests of the same run: when, how long it took, and
the name of its folder in the event store."""


def run_rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every run table (but the ``VARYING`` columns), sorted."""
    with open_database(Path(db), read_only=True) as con:
        rows = {}
        for table in RUN_TABLES:
            varying = VARYING.get(table)
            columns = f"* EXCLUDE ({', '.join(varying)})" if varying else "*"
            rows[table] = con.execute(f"SELECT {columns} FROM {table} ORDER BY ALL").fetchall()
    return rows


def die_on(file_name: str) -> None:
    """A worker process's initializer (pickled by reference, so it crosses the process boundary where
    a monkeypatch would not): from then on the worker's parse of ``file_name`` ends the process at
    once, as the kernel's OOM killer would."""
    parse = shards.parse_trace_file

    def parse_or_die(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
        if Path(path).name == file_name:
            os._exit(1)
        return parse(path, spill_dir)

    shards.parse_trace_file = parse_or_die  # type: ignore[assignment]


def test_workers_ship_shards_and_store_what_in_process_parsing_stores(tmp_path: Path) -> None:
    with ProcessPool(2) as pool:
        shipped = [r for _, ranks in Parsing(pool, FILES, tmp_path, "raise", []) for r in ranks]
    assert len(shipped) == 8 and all(isinstance(r.events, EventsFile) for r in shipped)
    held = [r for _, ranks in Parsing(InProcess(), FILES, tmp_path, "raise", []) for r in ranks]
    assert not any(isinstance(r.events, EventsFile) for r in held)  # this process keeps its tables
    shard_parent = tmp_path / "shards"
    for workers in (1, 2):
        with open_database(tmp_path / f"j{workers}.duckdb") as con:
            ingest_runs(con, [DLRM], IngestOptions(workers=workers, shard_dir=shard_parent))
    assert run_rows(tmp_path / "j1.duckdb") == run_rows(tmp_path / "j2.duckdb")
    assert list(shard_parent.iterdir()) == []  # each ingest's shard directory is removed


class _OnDemand:
    """An executor that runs a call only when waited on, oldest first: files in flight are countable."""

    crosses_processes = False
    remedy = ""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.calls: dict[concurrent.futures.Future[Any], tuple[Callable[..., Any], tuple[Any, ...]]] = {}
        self.most_in_flight = 0
        self.ran: list[str] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.calls[future] = (fn, args)
        self.most_in_flight = max(self.most_in_flight, sum(not f.done() for f in self.calls))
        return future

    def wait_first(self, futures: Collection[Any]) -> Collection[Any]:
        future = next(f for f in self.calls if f in futures and not f.done())
        fn, args = self.calls[future]
        self.ran.append(args[0].path.name)
        future.set_result(fn(*args))
        return [future]

    def worker_died(self, error: BaseException) -> bool:
        return False

    def close(self) -> None:
        pass


def test_at_most_capacity_files_are_in_flight_and_close_cancels_the_rest(tmp_path: Path) -> None:
    executor = _OnDemand(capacity=3)
    assert len(list(Parsing(executor, FILES, tmp_path, "raise", []))) == 8
    assert executor.most_in_flight == 3

    executor = _OnDemand(capacity=3)
    parsing = Parsing(executor, FILES, tmp_path, "raise", [])
    next(parsing)
    parsing.close()
    assert executor.ran == [FILES[0].path.name]
    assert len(executor.calls) == 4 and all(f.cancelled() for f in executor.calls if not f.done())


def test_a_worker_that_dies_is_one_error_naming_its_file_and_the_database_is_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with open_database(db) as con:
        ingest_runs(con, [DLRM], IngestOptions(workers=1))
    before = run_rows(db)
    fatal = FILES[3].path
    shard_parent = tmp_path / "shards"
    with open_database(db) as con, ProcessPool(2, die_on, (fatal.name,)) as pool, pytest.raises(WorkerError) as caught:
        ingest_runs(con, [DLRM], IngestOptions(workers=2, shard_dir=shard_parent), executor=pool)
    message = str(caught.value)
    assert fatal.name in message and "parser process died" in message and "fewer --workers" in message
    assert "\n" not in message
    assert run_rows(db) == before
    assert list(shard_parent.iterdir()) == []


def _run_with_a_corrupt_file(tmp_path: Path) -> Path:
    run = tmp_path / "pooled"
    run.mkdir()
    for trace_file in FILES[:3]:
        shutil.copy(trace_file.path, run / trace_file.path.name)
    (run / "worker3_corrupt.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [')[:-6])
    return run


def test_skip_mode_through_the_pool_reports_the_file_and_stores_the_rest(tmp_path: Path) -> None:
    run = _run_with_a_corrupt_file(tmp_path)
    with open_database(tmp_path / "t.duckdb") as con:
        with pytest.raises(TraceFormatError, match=r"worker3_corrupt\.pt\.trace\.json\.gz"):
            ingest_runs(con, [run], IngestOptions(workers=2))
        report = ingest_runs(con, [run], IngestOptions(workers=2, on_error="skip"))
    (stored,) = report.runs
    assert stored.ranks == 3
    assert [s.path.name for s in stored.skipped] == ["worker3_corrupt.pt.trace.json.gz"]
    assert all(isinstance(s, Skipped) and "corrupt" in s.reason for s in stored.skipped)


def test_bad_input_through_the_pool_is_one_line_and_skip_goes_on(tmp_path: Path) -> None:
    run = _run_with_a_corrupt_file(tmp_path)
    db = str(tmp_path / "cli.duckdb")
    runner = CliRunner()
    failed = runner.invoke(app, ["ingest", str(run), "-j", "2", "--db", db])
    assert failed.exit_code == 2, failed.output
    # off a terminal, progress comes as plain lines ("run 0/4 (0 s)"); the error is one line of its own
    (line,) = without_progress(failed.output)
    assert line.startswith("error: ")
    assert "worker3_corrupt.pt.trace.json.gz" in line and "corrupt" in line
    skipped = runner.invoke(
        app, ["ingest", str(run), "-j", "2", "--on-error", "skip", "--db", db], env={"COLUMNS": "200"}
    )
    assert skipped.exit_code == 0, skipped.output
    assert "skipped" in skipped.output and "worker3_corrupt" in skipped.output
    with open_database(Path(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM ranks").fetchone() == (3,)

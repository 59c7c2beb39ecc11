"""Bad input (docs/discovery.md#failure-policy): one clear line naming the file, exit status 2, and the
database unchanged."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import INVALID, KINETO, without_progress
from tracecal.cli.main import app
from tracecal.errors import RankConflictError, TraceFormatError
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sql.connection import open_database
from tracecal.sql.event_store import copy_database, event_store_dir

runner = CliRunner()
RANK0 = next((KINETO / "dlrm_8rank").glob("worker0_*"))
RANK1 = next((KINETO / "dlrm_8rank").glob("worker1_*"))


def _state(db: Path) -> list[tuple[object, ...]]:
    """Everything the ingest writes, to compare before and after a failed ingest."""
    with open_database(Path(db), read_only=True) as con:
        return [
            *con.execute("SELECT run_id, ranks_found, world_size FROM runs ORDER BY 1").fetchall(),
            *con.execute("SELECT run_id, rank, events FROM ranks ORDER BY 1, 2").fetchall(),
            *con.execute("SELECT run_id, count(*), sum(dur_ns) FROM events GROUP BY 1 ORDER BY 1").fetchall(),
            *sorted(path.name for path in event_store_dir(db).iterdir()),  # its files: none added or lost
        ]


def _good_run(parent: Path) -> Path:
    run = parent / "good"
    run.mkdir()
    shutil.copy(RANK0, run / RANK0.name)
    return run


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database holding one good run (``good``: rank 0 of dlrm), made once per module."""
    parent = tmp_path_factory.mktemp("template")
    path = parent / "db.duckdb"
    result = runner.invoke(app, ["ingest", str(_good_run(parent)), "--db", str(path), "--workers", "1"])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture
def db(template_db: Path, tmp_path: Path) -> Path:
    """A private copy of the template database."""
    return copy_database(template_db, tmp_path / "db.duckdb")


def _fails(db: Path, args: list[str], *expected: str) -> str:
    before = _state(db)
    result = runner.invoke(app, ["ingest", *args, "--db", str(db)])
    assert result.exit_code == 2, result.output
    lines = without_progress(result.output)  # progress lines off a terminal, then the one error line
    assert len(lines) == 1, result.output
    for text in expected:
        assert text in lines[0], lines[0]
    assert _state(db) == before
    return lines[0]


def test_nonexistent_path(db: Path, tmp_path: Path) -> None:
    _fails(db, [str(tmp_path / "nope")], "nope does not exist")


def test_empty_directory(db: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _fails(db, [str(tmp_path / "empty")], "empty is empty")


def test_directory_without_traces(db: Path, tmp_path: Path) -> None:
    run = tmp_path / "notes"
    run.mkdir()
    (run / "README.txt").write_text("no traces here")
    _fails(db, [str(run)], "no trace files in", "*.json.gz")


def test_corrupt_gzip(db: Path, tmp_path: Path) -> None:
    run = tmp_path / "broken"
    run.mkdir()
    (run / "rank-0.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage, not deflate")
    _fails(db, [str(run)], "rank-0.json.gz", "corrupt or truncated gzip")


def test_damaged_deflate_block(db: Path, tmp_path: Path) -> None:
    """A valid gzip header over a damaged deflate stream: zlib and ISA-L (when installed) raise
    different exception types; both are the same one-line error."""
    data = bytearray(RANK0.read_bytes())
    data[100:200] = b"x" * 100
    run = tmp_path / "damaged"
    run.mkdir()
    (run / "rank-0.json.gz").write_bytes(bytes(data))
    _fails(db, [str(run)], "rank-0.json.gz", "corrupt or truncated gzip")


def test_truncated_gzip(db: Path, tmp_path: Path) -> None:
    run = tmp_path / "cut"
    run.mkdir()
    (run / "rank-0.json.gz").write_bytes(RANK0.read_bytes()[:5000])
    _fails(db, [str(run)], "rank-0.json.gz", "gzip")


def test_real_truncated_header(db: Path) -> None:
    _fails(db, [str(INVALID / "truncated_header.json.gz")], "truncated_header.json.gz", "invalid JSON")


def test_json_that_is_not_a_trace(db: Path, tmp_path: Path) -> None:
    run = tmp_path / "config"
    run.mkdir()
    (run / "rank-0.json").write_text(json.dumps({"lr": 0.1, "layers": 4}))
    _fails(db, [str(run)], "rank-0.json", "not a Kineto trace")


def test_event_missing_required_key_names_file_index_and_key(db: Path, tmp_path: Path) -> None:
    run = tmp_path / "damaged"
    run.mkdir()
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}, {"ph": "X", "name": "x", "dur": 1}]
    (run / "rank-0.json").write_text(json.dumps({"traceEvents": events}))
    _fails(db, [str(run)], "rank-0.json", "event 1", "'ts'")


def test_duplicate_rank_leaves_the_database_unchanged(db: Path, tmp_path: Path) -> None:
    run = tmp_path / "dup"
    run.mkdir()
    shutil.copy(RANK0, run / "a.pt.trace.json.gz")
    shutil.copy(RANK0, run / "b.pt.trace.json.gz")
    _fails(db, [str(run), "--workers", "2"], "both hold rank 0")


def test_failed_reingest_keeps_the_previous_run(db: Path, tmp_path: Path) -> None:
    """The run's old rows are deleted inside the transaction: a failure must bring them back."""
    run = _good_run(tmp_path)
    (run / "rank-1.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X"'))
    _fails(db, [str(run), "--workers", "1"], "rank-1.json.gz")


def test_on_error_skip_reports_what_was_skipped(db: Path, tmp_path: Path) -> None:
    run = tmp_path / "partly"
    run.mkdir()
    shutil.copy(RANK1, run / RANK1.name)
    (run / "rank-0.json.gz").write_bytes(b"not gzip at all")
    result = runner.invoke(app, ["ingest", str(run), "--on-error", "skip", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "rank-0.json.gz" in result.output
    assert "corrupt or truncated gzip" in result.output
    with open_database(Path(db), read_only=True) as con:
        assert con.execute("SELECT rank FROM ranks WHERE run_id = 'partly'").fetchall() == [(1,)]


def test_on_error_skip_with_nothing_left_ingests_nothing(db: Path, tmp_path: Path) -> None:
    run = tmp_path / "hopeless"
    run.mkdir()
    (run / "rank-0.json.gz").write_bytes(b"not gzip at all")
    before = _state(db)
    result = runner.invoke(app, ["ingest", str(run), str(tmp_path / "missing"), "--on-error", "skip", "--db", str(db)])
    assert result.exit_code == 1, result.output
    assert "every trace file failed" in result.output and "missing does not exist" in result.output
    assert "nothing ingested" in result.output
    assert _state(db) == before


def test_unknown_on_error_value(db: Path, tmp_path: Path) -> None:
    _fails(db, [str(tmp_path), "--on-error", "ignore"], "--on-error must be raise or skip")


def test_sqlite_that_is_not_an_nsight_export(db: Path, tmp_path: Path) -> None:
    """An .sqlite file is routed to the Nsight reader, which refuses it by name."""
    run = tmp_path / "nsys"
    run.mkdir()
    (run / "rank0.sqlite").write_bytes(b"SQLite format 3\x00")
    _fails(db, [str(run)], "rank0.sqlite")


def test_worker_processes_report_bad_files_and_duplicate_ranks(db: Path, tmp_path: Path) -> None:
    """The same failures through the worker process pool."""
    run = tmp_path / "pooled"
    run.mkdir()
    shutil.copy(RANK0, run / "rank-0.json.gz")
    shutil.copy(RANK1, run / "rank-1.json.gz")
    (run / "rank-2.json.gz").write_bytes(b"not gzip at all")
    before = _state(db)
    with open_database(db) as con:
        with pytest.raises(TraceFormatError, match=r"rank-2\.json\.gz: corrupt"):
            ingest_runs(con, [run], IngestOptions(workers=2))
        report = ingest_runs(con, [run], IngestOptions(workers=2, on_error="skip"))
    (stored,) = report.runs
    assert stored.ranks == 2 and [s.path.name for s in stored.skipped] == ["rank-2.json.gz"]
    (run / "rank-2.json.gz").unlink()
    shutil.copy(RANK1, run / "copy.pt.trace.json.gz")  # distributedInfo says rank 1 as well
    with open_database(db) as con, pytest.raises(RankConflictError, match="both hold rank 1"):
        ingest_runs(con, [run], IngestOptions(workers=2))
    with open_database(Path(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM ranks WHERE run_id = 'pooled'").fetchone() == (2,)
    assert _state(db) != before  # the skip-mode ingest is the only change

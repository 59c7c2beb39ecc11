"""The event store: ranks' events as Parquet files beside the database, read through the ``events`` view."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pytest

from tracecal.errors import RankConflictError, TraceFormatError
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.schema import EVENTS
from tracecal.sql.connection import open_database
from tracecal.sql.event_store import RANK_FILE, copy_database, event_store_dir

KINETO = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "kineto"
DLRM = KINETO / "dlrm_8rank"
BERT = KINETO / "single" / "h100_bert_small_inference.json.gz"
COUNT = "SELECT run_id, rank, count(*) FROM events GROUP BY ALL ORDER BY ALL"


def _run_dirs(db: Path) -> list[str]:
    return sorted(p.name for p in event_store_dir(db).iterdir())


def test_the_view_has_the_declared_columns_types_and_comments(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    for ingest in (False, True):  # a new database's empty view, then one over a run's files
        with open_database(db) as con:
            if ingest:
                ingest_runs(con, [BERT], IngestOptions(run_id="bert"))
            described = con.execute(
                "SELECT column_name, data_type, comment FROM duckdb_columns() WHERE table_name = 'events' "
                "ORDER BY column_index"
            ).fetchall()
            assert described == [(c.name, c.sql_type, c.doc) for c in EVENTS.columns]
            assert con.execute("SELECT comment FROM duckdb_views() WHERE view_name = 'events'").fetchall() == [
                (EVENTS.doc,)
            ]
    assert _run_dirs(db)[0].startswith("bert-")
    (run_dir,) = (event_store_dir(db)).iterdir()
    assert sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*.parquet")) == [f"rank=0/{RANK_FILE}"]


def test_reingest_replaces_the_run_folder_and_a_failed_one_leaves_it(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with open_database(db) as con:
        ingest_runs(con, [DLRM], IngestOptions(workers=1))
        first, counts = _run_dirs(db), con.execute(COUNT).fetchall()
        ingest_runs(con, [DLRM], IngestOptions(workers=1))
        second = _run_dirs(db)
        assert len(first) == len(second) == 1 and first != second  # a new folder; the old one deleted
        assert con.execute(COUNT).fetchall() == counts
        run = tmp_path / "dlrm_8rank"  # the same run with a duplicate rank: refused, rolled back
        shutil.copytree(DLRM, run)
        shutil.copy(next(DLRM.glob("worker1_*")), run / "copy.pt.trace.json.gz")
        with pytest.raises(RankConflictError):
            ingest_runs(con, [run], IngestOptions(workers=1))
        assert _run_dirs(db) == second and con.execute(COUNT).fetchall() == counts


def test_a_database_moved_or_copied_with_its_store_reads_its_events(tmp_path: Path) -> None:
    db = tmp_path / "a" / "t.duckdb"
    with open_database(db) as con:
        ingest_runs(con, [BERT], IngestOptions(run_id="bert"))
        counts = con.execute(COUNT).fetchall()
    moved = tmp_path / "b" / "t.duckdb"
    moved.parent.mkdir()
    shutil.move(db, moved)
    shutil.move(event_store_dir(db), event_store_dir(moved))
    with open_database(moved, read_only=True) as con:
        assert con.execute(COUNT).fetchall() == counts
    copied = copy_database(moved, tmp_path / "c" / "renamed.duckdb")  # its store is renamed with it
    shutil.rmtree(event_store_dir(moved))  # the copy reads its own files, not the original's
    with open_database(copied, read_only=True) as con:
        assert con.execute(COUNT).fetchall() == counts
    cwd = Path.cwd()
    try:  # a plain DuckDB session in the database's folder reads the view too
        os.chdir(copied.parent)
        with duckdb.connect(copied.name, read_only=True) as con:
            assert con.execute(COUNT).fetchall() == counts
    finally:
        os.chdir(cwd)


def test_folders_no_run_names_are_removed_and_a_lost_folder_is_left_out(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with open_database(db) as con:
        ingest_runs(con, [BERT], IngestOptions(run_id="lost"))
        store = event_store_dir(db)
        orphan = store / "killed_run-0123abcd"  # as a process killed before its clean-up leaves one
        (orphan / "rank=0").mkdir(parents=True)
        mine = store / "notes"  # not a folder the store makes: never touched
        mine.mkdir()
        shutil.rmtree(next(store.glob("lost-*")))  # deleted by hand
        ingest_runs(con, [BERT], IngestOptions(run_id="kept"))
        assert not orphan.exists() and mine.is_dir()
        assert {r for r, _, _ in con.execute(COUNT).fetchall()} == {"kept"}
        assert con.execute("SELECT count(*) FROM ranks WHERE run_id = 'lost'").fetchall() == [(1,)]


def test_a_refused_first_ingest_leaves_no_store(tmp_path: Path) -> None:
    run = tmp_path / "bad"
    run.mkdir()
    (run / "rank-0.json").write_text('{"traceEvents": [{"ph": "X", "name": "a"}]}')  # no ts: refused
    db = tmp_path / "t.duckdb"
    with open_database(db) as con, pytest.raises(TraceFormatError):
        ingest_runs(con, [run], IngestOptions(workers=1))
    assert not event_store_dir(db).exists()


def test_two_databases_of_one_folder_keep_their_own_events(tmp_path: Path) -> None:
    """``runs.duckdb`` and ``runs.db`` have one stem: each has a store of its own, so that one's
    clean-up of folders it does not name never deletes the other's."""
    counts = []
    for name, run_id in (("runs.duckdb", "first"), ("runs.db", "second")):
        with open_database(tmp_path / name) as con:
            ingest_runs(con, [BERT], IngestOptions(run_id=run_id))
    with open_database(tmp_path / "runs.duckdb") as con:
        ingest_runs(con, [BERT], IngestOptions(run_id="first"))  # removes the folders it does not name
    for name in ("runs.duckdb", "runs.db"):
        with open_database(tmp_path / name, read_only=True) as con:
            counts.append(con.execute("SELECT run_id, count(*) > 0 FROM events GROUP BY ALL").fetchall())
    assert counts == [[("first", True)], [("second", True)]]


def test_a_command_on_a_database_whose_store_is_gone_says_so_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tracecal.cli.main import app

    db = tmp_path / "t.duckdb"
    with open_database(db) as con:
        ingest_runs(con, [BERT], IngestOptions(run_id="bert"))
    event_store_dir(db).rename(tmp_path / "moved")
    result = CliRunner().invoke(app, ["runs", "--db", str(db)])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ") and ".events folder beside it" in line

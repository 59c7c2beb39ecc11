"""The event store: every rank's events as one Parquet file beside the database, read through the
``events`` view.

A run's events are most of a database's bytes and were most of the loader's work: inserting them
into a DuckDB table re-reads and re-compresses every event a worker has already written to a Parquet
shard, all of it in the one loader process while the workers wait for it. So they are not inserted:
the shard itself is kept, renamed into the store, and ``events`` is a view that reads the store's files.
The other tables (operators, collectives, iterations, ...) stay in the database file.

Layout, for a database ``runs/tracecal.duckdb``::

    runs/tracecal.duckdb.events/                the store (event_store_dir)
        GPT_20B_4_4_8-3f9a0c1e/                  one directory per ingest of a run (runs.events_dir)
            rank=0/events.parquet                one file per rank (hive-partitioned by rank)
            rank=1/events.parquet

``runs.events_dir`` holds the run's directory relative to the database's directory, and the view's
paths are written relative to it too, so a database moved with its store (or renamed alone) keeps
reading them; ``open_database`` sets DuckDB's ``file_search_path`` to the database's directory. A
plain ``duckdb`` session reads ``events`` when started in that directory, or after
``SET file_search_path = '<the database's directory>'``.

Each ingest of a run writes a new directory (the run id plus a random token); the run's transaction
switches the view to it, and the directory it replaced is deleted only after the commit
(``EventStore.after_commit``), while one of a run that rolled back is deleted at once: a reader of
the database never sees a half-written run, and a failed ingest leaves the old one in place.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path

import duckdb

from tracecal.errors import TracecalError
from tracecal.schema import EVENTS, sql_string

RANK_FILE = "events.parquet"
"""The name of each rank's file in its ``rank=N`` directory."""

_RUN_DIR = re.compile(r"^[A-Za-z0-9._-]*-[0-9a-f]{8}$")
"""The directories ``EventStore.new_run_dir`` makes: the only ones ``EventStore.remove_orphans`` may delete."""


def event_store_dir(db_path: Path) -> Path:
    """The event store of a database: ``<db file name>.events/`` next to it. The whole name, suffix
    included: two databases of one folder (``runs.duckdb``, ``runs.db``) never share a store, whose
    folders no run of the database names are deleted (``EventStore.remove_orphans``)."""
    return db_path.with_name(db_path.name + ".events")


def database_path(con: duckdb.DuckDBPyConnection) -> Path:
    """The database file ``con`` is connected to.

    Raises:
        TracecalError: an in-memory database (it has no directory to keep events in).
    """
    row = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    if not row or not row[0][0]:
        raise TracecalError("events are kept beside a database file; open a database file, not an in-memory one")
    return Path(row[0][0]).absolute()


def search_events_from(con: duckdb.DuckDBPyConnection, db_path: Path) -> None:
    """Let ``con`` resolve the view's relative paths: DuckDB's ``file_search_path`` is set to the
    database's directory (relative paths in a user's own queries still resolve as before)."""
    con.execute("SET file_search_path = ?", [str(db_path.absolute().parent)])


def events_view_statement(run_dirs: Sequence[tuple[str, str]]) -> str:
    """``CREATE OR REPLACE VIEW events`` over the runs' directories (``(run_id, events_dir)``), with the
    columns, types and comments of ``schema.EVENTS``: one ``read_parquet`` per run, its ``rank`` from
    the ``rank=N`` directories (a filter on it reads only that rank's file) and its ``run_id`` a
    constant (a filter on it reads only that run's files). With no run, an empty relation of those
    columns."""
    columns = [c for c in EVENTS.columns if c.name not in ("run_id", "rank")]
    typed = ", ".join(f"CAST({c.name} AS {c.sql_type}) AS {c.name}" for c in columns)
    if run_dirs:
        body = "\nUNION ALL\n".join(
            f"SELECT {sql_string(run_id)}::VARCHAR AS run_id, rank, {typed} FROM read_parquet("
            f"{sql_string(f'{events_dir}/*/{RANK_FILE}')}, hive_partitioning = true, hive_types = {{'rank': INTEGER}})"
            for run_id, events_dir in run_dirs
        )
    else:
        body = "SELECT " + ", ".join(f"CAST(NULL AS {c.sql_type}) AS {c.name}" for c in EVENTS.columns) + " WHERE false"
    comments = [f"COMMENT ON VIEW events IS {sql_string(EVENTS.doc)};"]
    comments += [f"COMMENT ON COLUMN events.{c.name} IS {sql_string(c.doc)};" for c in EVENTS.columns]
    return f"CREATE OR REPLACE VIEW events AS\n{body};\n" + "\n".join(comments)


def refresh_events_view(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)create ``events`` over the directories ``runs.events_dir`` names, inside the caller's
    transaction. DuckDB reads each run's file list when it creates the view, so a run whose directory
    is gone (deleted by hand) is left out of it rather than making every later ingest fail: its
    ``ranks`` rows remain, its events read as none."""
    run_dirs = con.execute(
        "SELECT run_id, events_dir FROM runs WHERE events_dir IS NOT NULL ORDER BY run_id"
    ).fetchall()
    present: list[tuple[str, str]] = []
    if run_dirs:  # an in-memory database (no runs) has no folder to look in
        base = database_path(con).parent
        present = [(str(r), str(d)) for r, d in run_dirs if any((base / d).glob(f"*/{RANK_FILE}"))]
    con.execute(events_view_statement(present))


class EventStore:
    """The store of one database, for one ingest: makes the directory of a run being stored, moves
    ranks' files into it, and deletes what a commit replaced or a rollback abandoned."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        path = database_path(con)
        self.db_dir, self.root = path.parent, event_store_dir(path)
        self.replaced: list[Path] = []
        self.written: list[Path] = []

    def new_run_dir(self, run_id: str) -> Path:
        """A new, empty directory for one ingest of ``run_id``."""
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)[:80] or "run"
        path = self.root / f"{slug}-{secrets.token_hex(4)}"
        path.mkdir(parents=True)
        self.written.append(path)
        return path

    def relative(self, run_dir: Path) -> str:
        """``run_dir`` as ``runs.events_dir`` holds it: relative to the database's directory, with ``/``."""
        return run_dir.relative_to(self.db_dir).as_posix()

    def replace_run(self, run_id: str) -> None:
        """Note the directory of the run's stored events, to delete once the new ones are committed."""
        rows = self.con.execute("SELECT events_dir FROM runs WHERE run_id = ?", [run_id]).fetchall()
        self.replaced += [self.db_dir / row[0] for row in rows if row[0]]

    def after_commit(self) -> None:
        """Delete the directories the committed runs replaced."""
        for path in self.replaced:
            shutil.rmtree(path, ignore_errors=True)
        self.replaced, self.written = [], []

    def after_rollback(self) -> None:
        """Delete the directories written for runs that were rolled back (and the store itself when
        that leaves it empty: a refused first ingest writes nothing beside the database); what they
        replaced stays."""
        for path in self.written:
            shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):  # not empty, or gone
            self.root.rmdir()
        self.replaced, self.written = [], []

    def remove_orphans(self) -> list[Path]:
        """Delete the store's run directories no run names (left by a process killed between a commit
        and its clean-up, or by a rollback that could not delete them). Only directories this module
        makes are touched; returns those deleted."""
        if not self.root.is_dir():
            return []
        named = {
            (self.db_dir / row[0]).resolve()
            for row in self.con.execute("SELECT events_dir FROM runs WHERE events_dir IS NOT NULL").fetchall()
        }
        gone = []
        for path in self.root.iterdir():
            if path.is_dir() and _RUN_DIR.match(path.name) and path.resolve() not in named:
                shutil.rmtree(path, ignore_errors=True)
                gone.append(path)
        return gone


def rank_file(run_dir: Path, rank: int) -> Path:
    """Where a rank's events are kept in its run's directory (its ``rank=N`` directory made)."""
    target = run_dir / f"rank={rank}" / RANK_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def keep_file(source: Path, target: Path) -> None:
    """Move a rank's Parquet file into the store: a rename on the same filesystem, else a copy."""
    try:
        os.replace(source, target)
    except OSError:
        shutil.move(str(source), str(target))


def copy_database(source: Path, target: Path) -> Path:
    """Copy a database file and its event store to ``target`` (a new path): a copy of the file alone
    would read no events. A store whose name changes with the file's is renamed in the copy's
    ``runs.events_dir`` and view. Returns ``target``.

    Raises:
        TracecalError: ``target`` or its store exists already.
    """
    old_store, new_store = event_store_dir(source), event_store_dir(target)
    if target.exists() or new_store.exists():
        raise TracecalError(f"{target} or {new_store} exists already; copy the database to a new path")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    if old_store.is_dir():
        shutil.copytree(old_store, new_store)
    if old_store.name != new_store.name and old_store.is_dir():
        with contextlib.closing(duckdb.connect(str(target))) as con:
            old, new = old_store.name, new_store.name
            search_events_from(con, target)
            con.execute("BEGIN TRANSACTION")
            con.execute(
                "UPDATE runs SET events_dir = ? || substr(events_dir, ?) WHERE starts_with(events_dir, ?)",
                [new, len(old) + 1, old + "/"],
            )
            refresh_events_view(con)
            con.execute("COMMIT")
    return target

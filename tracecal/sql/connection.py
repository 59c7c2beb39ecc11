"""Opening a tracecal database: its tables, the table macros the views share and its views, as
``tracecal.sql.registry`` reads them from the package's ``.sql`` files; views are created in
dependency order.

Callers own the connection (``with open_database(path) as con: ...``); library functions take a
connection and never open hidden global ones.

``events`` is not a table but the event store's view of Parquet files beside the database
(``tracecal.sql.event_store``): it is made after the tables and before the views that read it, and
every connection resolves its relative paths from the database's folder (DuckDB's
``file_search_path``).

Making the schema costs about 0.1 s of DDL and view definitions, more than a whole ingest of a small
trace or a ``tracecal sql`` query. So ``tracecal_meta`` records a fingerprint of the DDL and view files
that made the database (``schema_fingerprint``); a database opened by the tracecal that made it, with
every table and view still present, is used as it is, and a read-only session on it needs no
temporary views. Any other database (another version, a view or table missing) gets the full path.

A *new* database need not pay for the DDL either: given a cache directory, ``open_database`` copies
an empty database made once by this tracecal and this DuckDB (``template_path``; a copy of its
0.8 MB costs well under a millisecond) and then finds its schema current. The template is built
the first time, in its own file renamed into place when complete, so processes racing to build it
never see half of one; a template DuckDB cannot open is deleted and the database made the full way.
Templates of other versions stay in the cache (one per schema and DuckDB version, ~0.8 MB each);
the file of a build whose process died is deleted by a later build (``STALE_BUILD_SECONDS``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from tracecal import __version__
from tracecal.errors import InputNotFoundError, SchemaError
from tracecal.schema import EVENTS, SCHEMA_VERSION, TABLES, Table
from tracecal.sql import registry
from tracecal.sql.event_store import refresh_events_view, search_events_from
from tracecal.sql.registry import SqlRegistryError, View

_META_DDL = """
CREATE TABLE IF NOT EXISTS tracecal_meta (key VARCHAR PRIMARY KEY, value VARCHAR);
COMMENT ON TABLE tracecal_meta IS 'tracecal schema version and the tool version that created the database';
"""


def query_arrow(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
) -> pa.Table:
    """Run one statement with positional (``?``, ``$1``) or named (``$name``) ``params`` and return its
    rows as an Arrow table (empty for statements without rows)."""
    relation = con.sql(sql, params=params)
    if relation is None:
        return pa.table({})
    to_arrow = getattr(relation, "to_arrow_table", None) or relation.arrow  # DuckDB 2.x / 1.x
    return to_arrow()


NEW_ROWS = "_tracecal_new_rows"
"""The name under which ``replace_rows`` shows its new rows to its ``where`` clause."""


def replace_rows(
    con: duckdb.DuckDBPyConnection,
    table: Table,
    rows: pa.Table | None,
    *,
    where: str,
    params: Sequence[Any] = (),
    returning: Sequence[str] = (),
) -> list[tuple[Any, ...]]:
    """Delete the rows of ``table`` that match ``where``, then insert ``rows``, in one transaction.

    Either both happen or neither does. ``where`` is an SQL condition over ``table`` with ``?``
    placeholders bound to ``params``; it may read the new rows as ``NEW_ROWS`` (an upsert by key:
    ``f"sample_id IN (SELECT sample_id FROM {NEW_ROWS})"``). ``rows`` holds columns of ``table``,
    matched by name (a column it lacks is NULL); None or no rows only deletes. Must not be called inside an
    open transaction.

    Returns:
        The deleted rows' ``returning`` columns (none when ``returning`` is empty).
    """
    if rows is not None:
        con.register(NEW_ROWS, rows)
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            cut = f" RETURNING {', '.join(returning)}" if returning else ""
            deleted = con.execute(f"DELETE FROM {table.name} WHERE {where}{cut}", list(params))
            gone = deleted.fetchall() if returning else []
            if rows is not None and rows.num_rows:
                con.execute(f"INSERT INTO {table.name} BY NAME SELECT * FROM {NEW_ROWS}")  # name from schema
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        if rows is not None:
            con.unregister(NEW_ROWS)
    return gone


@cache
def schema_fingerprint() -> str:
    """sha256 of the schema version, every table DDL, macro and view definition this tracecal ships and
    the meta table's own: a version bump alone also takes the full path (and its version check)."""
    digest = hashlib.sha256(f"{SCHEMA_VERSION}\0{_META_DDL}".encode())
    for path in registry.sql_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def schema_is_current(con: duckdb.DuckDBPyConnection) -> bool:
    """The database was made by these DDL, macro and view files (its stored fingerprint is this
    tracecal's), every table still has its columns and every view is there: nothing to create or
    replace. Macros are trusted to the fingerprint: looking one up lists every built-in function, which
    costs more than the rest of this check.
    Asks the catalog only, so a failed lookup never aborts the caller's transaction."""
    stored = _stored_columns(con)
    if "tracecal_meta" not in stored:  # a new database (or not a tracecal one)
        return False
    # fetchall: DuckDB 2 keeps a result open until a fetch returns no more rows
    rows = con.execute("SELECT value FROM tracecal_meta WHERE key = 'schema_fingerprint'").fetchall()
    return (
        rows == [(schema_fingerprint(),)]
        and all(stored.get(table.name) == table.column_names for table in TABLES)
        and stored.get(EVENTS.name) == EVENTS.column_names
        and all(name in stored for name in registry.view_names())  # a view's columns are listed too
    )


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create missing tables and (re)create all views, unless the schema is current
    (``schema_is_current``); refuse a database of another schema version."""
    if schema_is_current(con):
        return
    con.execute(_META_DDL)
    row = con.execute("SELECT value FROM tracecal_meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        con.execute(
            "INSERT INTO tracecal_meta VALUES ('schema_version', ?), ('created_by', ?)",
            [str(SCHEMA_VERSION), __version__],
        )
    elif int(row[0]) != SCHEMA_VERSION:
        raise SchemaError(
            f"database schema version {row[0]} differs from this tracecal's {SCHEMA_VERSION}; "
            "re-ingest into a new database (--db NEW.duckdb)"
        )
    _check_columns(con)  # before the DDL: its COMMENT ON statements would fail on a foreign table first
    for statements in registry.table_ddl():
        con.execute(statements)
    refresh_events_view(con)  # before the views that read it
    create_views(con)
    con.execute(
        "INSERT OR REPLACE INTO tracecal_meta VALUES ('schema_fingerprint', ?)",
        [schema_fingerprint()],
    )


def _stored_columns(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """Column names of every table and view of the database, in order."""
    stored: dict[str, list[str]] = {}
    for table_name, column_name in con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() "
        "WHERE schema_name = 'main' AND database_name = current_database() ORDER BY table_name, column_index"
    ).fetchall():
        stored.setdefault(table_name, []).append(column_name)
    return stored


def _check_columns(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a database whose tables were created with other columns (an older development build),
    except that columns this version appends to a table are added to it (an additive change)."""
    stored = _stored_columns(con)
    for table in TABLES:
        have = stored.get(table.name)
        if have is not None and len(have) < len(table.columns) and table.column_names[: len(have)] == have:
            for column in table.columns[len(have) :]:
                con.execute(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {column.sql_type}")
            continue
        if have is not None and have != table.column_names:
            raise SchemaError(
                f"table {table.name} in this database has other columns than this tracecal expects "
                "(written by another version); use a new database (--db NEW.duckdb) and re-ingest"
            )


def create_views(con: duckdb.DuckDBPyConnection, *, temporary: bool = False) -> None:
    """(Re)create every macro, then every view in dependency order (``registry.view_definitions``:
    a view after the views it reads), each with its comments.

    ``temporary`` creates them as TEMP macros and views, which DuckDB allows on a read-only connection: a
    read-only session then sees this version's definitions even in a database written by an older one.
    A view that cannot bind raises in a writable database; in a temporary pass it is left out (its
    tables are missing from an older database and a query on it says so), and so are the views that
    read it.

    Raises:
        SqlRegistryError: a view file is malformed or its columns differ from its header's.
        SchemaError: a view does not bind in a writable database.
    """
    for macro in registry.macro_definitions():
        con.execute(macro.statements(temporary=temporary))
    for view in registry.view_definitions():
        try:
            create_view(con, view, temporary=temporary)
        except (duckdb.CatalogException, duckdb.BinderException) as exc:  # a table or column it reads is missing
            if temporary:
                continue
            raise SchemaError(f"view {view.name} ({view.path}) does not bind: {exc}".splitlines()[0]) from exc


def create_view(con: duckdb.DuckDBPyConnection, view: View, *, temporary: bool = False) -> None:
    """Create one view and store its comments; its dependencies must exist.

    Raises:
        SqlRegistryError: the view's columns are not the ones its header comments (in that order).
        duckdb.CatalogException, duckdb.BinderException: a table, macro, view or column it reads does not exist.
    """
    con.execute(view.create_statement(temporary=temporary))
    columns = con.sql(f"SELECT * FROM {view.name}").columns  # bound, not run; the name is the registry's
    if columns != view.column_names:
        uncommented = [c for c in columns if c not in view.column_names]
        absent = [c for c in view.column_names if c not in columns]
        what = (
            f"columns without a comment: {', '.join(uncommented)}" if uncommented else
            f"commented columns it does not have: {', '.join(absent)}" if absent else
            "its columns in another order than its header's"
        )  # fmt: skip
        raise SqlRegistryError(f"{view.path}: view {view.name} has {what}; list every column under `columns:`")
    con.execute(view.comment_statements())


def _ensure_schema_in_one_transaction(con: duckdb.DuckDBPyConnection) -> None:
    """``ensure_schema`` as one transaction: a new database then costs a third less CPU and a fraction
    of the wall time (one commit instead of one per DDL statement). Views are created in dependency
    order, so none fails to bind for want of another; a failure leaves the database as it was."""
    con.execute("BEGIN TRANSACTION")
    try:
        ensure_schema(con)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def template_path(cache_dir: Path) -> Path:
    """The cached empty database of this tracecal's schema, in this DuckDB's file format."""
    return cache_dir / f"empty-{schema_fingerprint()[:16]}-duckdb-{duckdb.__version__}.duckdb"


STALE_BUILD_SECONDS = 3600
"""A template build left this long (its process died; a build takes a fraction of a second) is
deleted by the next build in the same cache directory."""


def _build_template(template: Path) -> None:
    """Make the empty database at ``template``: built under a name of this process's own, renamed
    into place once DuckDB has closed (checkpointed) it."""
    for stale in template.parent.glob("*.building*"):
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > STALE_BUILD_SECONDS:
                stale.unlink()
    building = template.with_name(f"{template.name}.{os.getpid()}.building")
    try:
        con = duckdb.connect(str(building))
        try:
            _ensure_schema_in_one_transaction(con)
        finally:
            con.close()
        os.replace(building, template)
    finally:
        building.unlink(missing_ok=True)
        building.with_name(building.name + ".wal").unlink(missing_ok=True)


def _copy_template(path: Path, cache_dir: Path) -> Path | None:
    """Create ``path`` as a copy of the cached empty database, building that first when missing;
    returns the template it copied.

    Returns None, with ``path`` left as it was, when the cache cannot be used (not writable, disk
    full, or ``path`` appeared meanwhile): the caller then makes the schema itself, where a real
    error (a view that does not bind) is raised with its own message."""
    template = template_path(cache_dir)
    try:
        if not template.exists():
            cache_dir.mkdir(parents=True, exist_ok=True)
            _build_template(template)
        source = template.open("rb")
    except (OSError, duckdb.Error):
        return None
    with source:
        try:
            target = path.open("xb")  # never over a file another process just made
        except OSError:
            return None
        try:
            with target:
                shutil.copyfileobj(source, target, 1 << 20)
        except OSError:
            path.unlink(missing_ok=True)
            return None
    return template


def _connect(path: Path, read_only: bool, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    config: dict[str, str | bool | int | float | list[str]] = {} if threads is None else {"threads": threads}
    try:
        con = duckdb.connect(str(path), read_only=read_only, config=config)
    except duckdb.IOException as exc:
        raise SchemaError(f"cannot open database {path}: {str(exc).splitlines()[0]}") from exc
    search_events_from(con, path)
    return con


@contextmanager
def open_database(
    path: Path, *, read_only: bool = False, cache_dir: Path | None = None, threads: int | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open (creating if needed, unless read-only) a tracecal database with its schema in place.

    ``cache_dir``: where the empty-database template is kept (``Settings.cache_dir``); a new database
    is then a copy of it instead of ~0.1 s of DDL. None makes the schema in place.
    ``threads``: DuckDB's thread count for this connection from the start (default: DuckDB's, one per
    core); changing it later costs a few ms (DuckDB stops its thread pool).

    Raises:
        InputNotFoundError: ``read_only`` and the database file does not exist.
        SchemaError: the database was written by an incompatible schema version.
    """
    if read_only and not path.exists():
        raise InputNotFoundError(f"no database at {path}; ingest a run first (trace-ingest RUN_DIR) or pass --db PATH")
    copied_from: Path | None = None  # the template this new database is a copy of
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
        if cache_dir is not None and not path.exists():
            copied_from = _copy_template(path, cache_dir)
    try:
        con = _connect(path, read_only, threads)
    except SchemaError:
        if copied_from is None:
            raise
        # a damaged template: forget it, and make this database the full way
        path.unlink()
        copied_from.unlink(missing_ok=True)
        con = _connect(path, read_only, threads)
    try:
        if read_only:
            if not schema_is_current(con):  # written by another tracecal: this version's views
                create_views(con, temporary=True)
        else:
            _ensure_schema_in_one_transaction(con)
        yield con
    finally:
        con.close()

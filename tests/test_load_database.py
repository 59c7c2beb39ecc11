"""Opening a new database: the schema is made in one transaction (views in dependency order); with a
cache directory, a new database is a copy of an empty one made once (the template)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tracecal.config import resolve_cache_dir
from tracecal.schema import TABLES
from tracecal.sql import connection
from tracecal.sql.connection import open_database
from tracecal.sql.registry import view_names


def _catalog(path: Path) -> list[tuple[object, ...]]:
    """Every table, view and column of a database with its type and comment, and tracecal_meta."""
    with open_database(path, read_only=True) as con:
        columns = con.execute(
            "SELECT table_name, column_index, column_name, data_type, comment FROM duckdb_columns() "
            "WHERE NOT internal ORDER BY ALL"
        ).fetchall()
        comments = con.execute(
            "SELECT table_name, comment FROM duckdb_tables() UNION ALL "
            "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal ORDER BY ALL"
        ).fetchall()
        meta = con.execute("SELECT * FROM tracecal_meta ORDER BY ALL").fetchall()
    return [*columns, *comments, *meta]


def _objects(path: Path) -> tuple[set[str], set[str]]:
    with open_database(path, read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        views = {
            r[0]
            for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal AND NOT temporary").fetchall()
        }
    return tables, views


def test_new_database_gets_every_table_and_view_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    ensure = connection.ensure_schema
    monkeypatch.setattr(connection, "ensure_schema", lambda con: (calls.append(1), ensure(con))[1])
    with open_database(tmp_path / "a.duckdb"):
        pass
    tables, views = _objects(tmp_path / "a.duckdb")
    assert {t.name for t in TABLES} <= tables
    assert set(view_names()) <= views
    assert len(calls) == 1


def test_a_new_database_copied_from_the_template_equals_one_made_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template is built by the first new database (its DDL runs once), later ones are copies
    with the same tables, views, columns, comments and metadata, and take rows like any other."""
    cache = tmp_path / "cache"
    views_made: list[int] = []
    create_views = connection.create_views

    def counted_create_views(con: object, **kwargs: bool) -> None:
        views_made.append(1)
        create_views(con, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(connection, "create_views", counted_create_views)
    for name in ("first.duckdb", "second.duckdb", "third.duckdb"):
        with open_database(tmp_path / name, cache_dir=cache) as con:
            con.execute("INSERT INTO tracecal_meta VALUES (?, 'x')", [name])
    assert len(views_made) == 1
    assert connection.template_path(cache).exists()
    with open_database(tmp_path / "in_place.duckdb") as con:
        con.execute("INSERT INTO tracecal_meta VALUES ('third.duckdb', 'x')")
    assert _catalog(tmp_path / "third.duckdb") == _catalog(tmp_path / "in_place.duckdb")
    with open_database(tmp_path / "second.duckdb", read_only=True) as con:  # each copy is its own database
        assert con.execute("SELECT key FROM tracecal_meta WHERE value = 'x'").fetchall() == [("second.duckdb",)]


def test_a_damaged_template_is_dropped_and_the_database_made_in_place(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    connection.template_path(cache).write_bytes(b"not a duckdb file" * 1000)
    with open_database(tmp_path / "a.duckdb", cache_dir=cache):
        pass
    assert not connection.template_path(cache).exists()
    tables, views = _objects(tmp_path / "a.duckdb")
    assert {t.name for t in TABLES} <= tables
    assert set(view_names()) <= views


def test_a_build_left_by_a_dead_process_is_deleted_by_the_next_build(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = cache / "empty-0-duckdb-1.duckdb.4242.building"
    dead.write_bytes(b"half a database")
    hours_ago = time.time() - connection.STALE_BUILD_SECONDS - 60
    os.utime(dead, (hours_ago, hours_ago))
    running = cache / "empty-0-duckdb-1.duckdb.4243.building"  # another process building right now
    running.write_bytes(b"a database being made")
    with open_database(tmp_path / "a.duckdb", cache_dir=cache):
        pass
    assert not dead.exists() and running.exists()
    assert connection.template_path(cache).exists()


def test_an_unusable_cache_directory_still_opens_the_database(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("in the way")
    with open_database(tmp_path / "a.duckdb", cache_dir=tmp_path / "a_file" / "cache"):
        pass
    tables, _ = _objects(tmp_path / "a.duckdb")
    assert {t.name for t in TABLES} <= tables


def test_an_existing_database_is_never_replaced_by_the_template(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with open_database(tmp_path / "kept.duckdb") as con:
        con.execute("INSERT INTO tracecal_meta VALUES ('mine', 'kept')")
    with open_database(tmp_path / "kept.duckdb", cache_dir=cache) as con:
        assert con.execute("SELECT value FROM tracecal_meta WHERE key = 'mine'").fetchall() == [("kept",)]


def test_the_thread_count_is_set_when_connecting_and_not_kept_in_the_file(tmp_path: Path) -> None:
    setting = "SELECT current_setting('threads')"
    with open_database(tmp_path / "t.duckdb", cache_dir=tmp_path / "cache") as con:
        default = con.execute(setting).fetchall()
    for path in (tmp_path / "t.duckdb", tmp_path / "new.duckdb"):  # an existing and a new database
        with open_database(path, cache_dir=tmp_path / "cache", threads=1) as con:
            assert con.execute(setting).fetchall() == [(1,)]
    with open_database(tmp_path / "t.duckdb") as con:
        assert con.execute(setting).fetchall() == default


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TRACECAL_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x"}, Path("/c")),
        ({"TRACECAL_CACHE_DIR": ""}, None),
        ({"XDG_CACHE_HOME": "/x"}, Path("/x/tracecal")),
        ({"HOME": "/h"}, Path("/h/.cache/tracecal")),
    ],
)
def test_cache_directory_from_the_environment(
    env: dict[str, str], expected: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TRACECAL_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert resolve_cache_dir() == expected

"""Opening a new database: the schema is made in one transaction, or statement by statement when a
view cannot bind yet (a failed statement aborts a DuckDB transaction)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracecal.schema import TABLES
from tracecal.sql import connection
from tracecal.sql.connection import open_database


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
    assert {p.stem for p in connection.view_files()} <= views
    assert len(calls) == 1


def test_views_in_an_order_that_cannot_bind_fall_back_to_statement_by_statement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reversed, a view comes before the view it reads: the transaction is rolled back and the
    schema made again with retries, so the database ends up complete all the same."""
    files = connection.view_files()
    monkeypatch.setattr(connection, "view_files", lambda: list(reversed(files)))
    calls: list[int] = []
    ensure = connection.ensure_schema
    monkeypatch.setattr(connection, "ensure_schema", lambda con: (calls.append(1), ensure(con))[1])
    with open_database(tmp_path / "b.duckdb"):
        pass
    tables, views = _objects(tmp_path / "b.duckdb")
    assert {t.name for t in TABLES} <= tables
    assert {p.stem for p in files} <= views
    assert len(calls) == 2

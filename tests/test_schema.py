"""The schema module is the single declaration of every table; the generated DDL must match it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tracecal.errors import SchemaError
from tracecal.schema import SHAPE_COLUMNS, TABLES, TABLES_DIR, arrow_schema, ddl, polars_schema
from tracecal.sql import connection
from tracecal.sql.connection import open_database


def test_committed_ddl_files_match_schema_module() -> None:
    for table in TABLES:
        committed = (TABLES_DIR / f"{table.name}.sql").read_text()
        assert committed == ddl(table), f"run `python -m tracecal.schema` to regenerate {table.name}.sql"


def test_units_are_in_column_names() -> None:
    for table in TABLES:
        for col in table.columns:
            if col.name.endswith(("_ts", "_dur", "_time")):
                raise AssertionError(f"{table.name}.{col.name}: time columns end in _ns")


def test_database_tables_have_every_column_commented(db_path: Path) -> None:
    with open_database(db_path) as con:
        rows = con.execute(
            "SELECT table_name, column_name, comment FROM duckdb_columns() WHERE schema_name = 'main'"
        ).fetchall()
    by_table: dict[str, dict[str, str | None]] = {}
    for table_name, column, comment in rows:
        by_table.setdefault(table_name, {})[column] = comment
    for table in TABLES:
        assert list(by_table[table.name]) == table.column_names
        assert all(by_table[table.name].values()), f"{table.name} has an uncommented column"


def test_arrow_schema_round_trips_through_duckdb(db_path: Path) -> None:
    for table in TABLES:
        empty = pa.Table.from_batches([], schema=arrow_schema(table))
        with open_database(db_path) as con:
            con.register("frame", empty)
            con.execute(f"INSERT INTO {table.name} SELECT * FROM frame")
            assert con.execute(f"SELECT count(*) FROM {table.name}").fetchone() == (0,)


def test_polars_schema_is_what_duckdb_hands_back_for_every_table(db_path: Path) -> None:
    """One SQL -> polars map: a frame built with ``polars_schema`` has the types and column order a
    query of the stored table returns."""
    import polars as pl

    with open_database(db_path) as con:
        for table in TABLES:
            stored = pl.from_arrow(con.sql(f"SELECT * FROM {table.name} LIMIT 0").to_arrow_table())
            assert isinstance(stored, pl.DataFrame)
            assert stored.schema == pl.Schema(polars_schema(table)), table.name
    shapes = polars_schema(SHAPE_COLUMNS)
    assert list(shapes) == [c.name for c in SHAPE_COLUMNS]


def test_read_only_sessions_see_current_views_over_stale_stored_ones(db_path: Path) -> None:
    with open_database(db_path) as con:  # as an older tracecal leaves it: its own views and fingerprint
        con.execute("CREATE OR REPLACE VIEW best_iteration AS SELECT 'stale' AS written_by_an_old_version")
        con.execute("UPDATE tracecal_meta SET value = 'an older tracecal' WHERE key = 'schema_fingerprint'")
    with open_database(db_path, read_only=True) as con:
        columns = [d[0] for d in con.execute("SELECT * FROM best_iteration").description]
    assert "written_by_an_old_version" not in columns
    assert "run_id" in columns


@pytest.mark.parametrize(
    "change",
    ["ALTER TABLE models ADD COLUMN from_an_old_build INTEGER", "ALTER TABLE models DROP COLUMN published_mape"],
)
def test_a_database_with_other_columns_is_refused_with_advice(db_path: Path, change: str) -> None:
    with open_database(db_path) as con:
        con.execute(change)
    with pytest.raises(SchemaError, match=r"table models .* new database"), open_database(db_path):
        pass


def test_a_database_without_columns_appended_since_gains_them(db_path: Path) -> None:
    with open_database(db_path) as con:  # as a tracecal before the two replays left it
        for table in ("predictions", "components"):
            con.execute(f"ALTER TABLE {table} DROP COLUMN unexplained_ns")
            con.execute(f"ALTER TABLE {table} DROP COLUMN replay")
        con.execute("INSERT INTO components (run_id, mode, rank, component) VALUES ('r', 'measured', 0, 'idle')")
    with open_database(db_path) as con:
        columns = [
            r[0]
            for r in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = 'components' ORDER BY column_index"
            ).fetchall()
        ]
        kept = con.execute("SELECT run_id, replay, unexplained_ns FROM components").fetchall()
    assert columns[-2:] == ["replay", "unexplained_ns"]
    assert kept == [("r", None, None)]


def _count_view_passes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    passes: list[bool] = []
    create = connection.create_views
    monkeypatch.setattr(
        connection,
        "create_views",
        lambda con, *, temporary=False: (passes.append(temporary), create(con, temporary=temporary))[1],
    )
    return passes


def test_a_current_database_is_opened_without_remaking_its_schema(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_database(db_path) as con:
        stored = con.execute("SELECT value FROM tracecal_meta WHERE key = 'schema_fingerprint'").fetchall()
    assert stored == [(connection.schema_fingerprint(),)]
    passes = _count_view_passes(monkeypatch)
    with open_database(db_path) as con:
        assert con.execute("SELECT count(*) FROM best_iteration").fetchone() == (0,)
    with open_database(db_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM comm_summary").fetchone() == (0,)
    assert passes == []


def test_a_missing_view_or_another_fingerprint_remakes_the_schema(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_database(db_path) as con:
        con.execute("DROP VIEW comm_summary")
    passes = _count_view_passes(monkeypatch)
    with open_database(db_path, read_only=True) as con:  # read-only: this version's views, as TEMP views
        assert con.execute("SELECT count(*) FROM comm_summary").fetchone() == (0,)
    with open_database(db_path) as con:  # writable: the view is made again
        con.execute("UPDATE tracecal_meta SET value = 'another tracecal' WHERE key = 'schema_fingerprint'")
    with open_database(db_path) as con:
        stored = con.execute("SELECT value FROM tracecal_meta WHERE key = 'schema_fingerprint'").fetchall()
    assert passes == [True, False, False]
    assert stored == [(connection.schema_fingerprint(),)]
    with open_database(db_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM comm_summary").fetchone() == (0,)
    assert len(passes) == 3


def test_a_schema_version_bump_is_refused_even_with_the_same_sql(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_database(db_path):
        pass
    monkeypatch.setattr(connection, "SCHEMA_VERSION", connection.SCHEMA_VERSION + 1)
    connection.schema_fingerprint.cache_clear()
    try:
        with pytest.raises(SchemaError, match="schema version"), open_database(db_path):
            pass
    finally:
        monkeypatch.undo()
        connection.schema_fingerprint.cache_clear()

"""`tracecal sql` and `tracecal runs` through typer's CliRunner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracecal.cli.main import app
from tracecal.sql import connection
from tracecal.sql.connection import open_database, template_path

runner = CliRunner()

HEAVY = ("polars", "duckdb", "pyarrow", "numpy", "pandas", "torch", "xgboost", "sklearn")


def test_sql_on_missing_database_is_one_clear_line(db_path: Path) -> None:
    result = runner.invoke(app, ["sql", "select 1", "--db", str(db_path)])
    assert result.exit_code == 2
    assert "no database at" in result.output
    assert not db_path.exists()


def test_sql_is_read_only_unless_write(db_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache):
        pass
    denied = runner.invoke(app, ["sql", "create table t(a int)", "--db", str(db_path)])
    assert denied.exit_code == 2
    assert "--write" in denied.output
    allowed = runner.invoke(app, ["sql", "create table t(a int)", "--write", "--db", str(db_path)])
    assert allowed.exit_code == 0, allowed.output


def test_sql_formats_and_file(db_path: Path, tmp_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache):
        pass
    query = tmp_path / "q.sql"
    query.write_text("select 42 as answer, 'x' as label")
    as_json = runner.invoke(app, ["sql", "--file", str(query), "--format", "json", "--db", str(db_path)])
    assert json.loads(as_json.output) == [{"answer": 42, "label": "x"}]
    out = tmp_path / "out.csv"
    written = runner.invoke(app, ["sql", "--file", str(query), "--format", "csv", "-o", str(out), "--db", str(db_path)])
    assert written.exit_code == 0
    assert out.read_text().splitlines() == ['"answer","label"', '42,"x"']


def test_sql_syntax_error_is_reported(db_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache):
        pass
    result = runner.invoke(app, ["sql", "selec 1", "--db", str(db_path)])
    assert result.exit_code == 2
    assert "syntax error" in result.output


def test_the_command_line_starts_without_the_data_libraries() -> None:
    """STYLE 11: `tracecal --help` (and the parsing of any command line) imports no data library;
    each command imports what it needs when it runs (0.48 -> 0.15 s for `tracecal --help`)."""
    probe = f"import sys, tracecal.cli.main; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_every_command_has_help() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        assert command.help, f"command {name} has no help text"
        sub = runner.invoke(app, [name, "--help"])
        assert sub.exit_code == 0, name


def test_a_writing_command_copies_its_new_database_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACECAL_CACHE_DIR", str(cache))
    first = runner.invoke(app, ["sql", "select count(*) from runs", "--write", "--db", str(tmp_path / "a.duckdb")])
    assert first.exit_code == 0, first.output
    assert template_path(cache).exists()
    monkeypatch.setattr(connection, "create_views", lambda con, **kw: pytest.fail("the copy's schema is current"))
    second = runner.invoke(app, ["sql", "select count(*) from runs", "--write", "--db", str(tmp_path / "b.duckdb")])
    assert second.exit_code == 0, second.output

"""The Python API: every CLI command has its `Session` method, docs/api.md's walk-through runs on the
shared data, `import tracecal` stays light, and failures are `TracecalError`s."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import pytest
import tomllib
import typer

from tests.conftest import GPUMODELING25, REPO, SHARED
from tracecal.api import Session
from tracecal.api.commands import COMMAND_METHODS, CONSOLE_SCRIPTS
from tracecal.cli.main import app
from tracecal.errors import InputNotFoundError, TracecalError

API_PAGE = REPO / "docs" / "api.md"


def _commands(typer_app: typer.Typer, prefix: str = "") -> Iterator[tuple[str, Callable[..., object]]]:
    """Every leaf command of a typer app as typed after ``tracecal`` (``"samples measure comm"``), with
    its function."""
    for command in typer_app.registered_commands:
        assert command.callback is not None
        yield f"{prefix}{command.name or command.callback.__name__}", command.callback
    for group in typer_app.registered_groups:
        assert group.typer_instance is not None
        yield from _commands(group.typer_instance, f"{prefix}{group.name} ")


def test_every_command_has_a_session_method_and_calls_it() -> None:
    """The command's function calls its method (or the ``_report`` / ``_arrow`` variant beside it):
    a command that runs steps of its own instead fails here, one whose method is gone fails too."""
    commands = dict(_commands(app))
    assert set(commands) == set(COMMAND_METHODS), (
        f"commands missing from tracecal/api/commands.py: {sorted(set(commands) - set(COMMAND_METHODS))}; "
        f"entries without a command: {sorted(set(COMMAND_METHODS) - set(commands))}"
    )
    for command, method in COMMAND_METHODS.items():
        assert callable(getattr(Session, method, None)), f"{command}: Session has no method {method}"
        assert inspect.getdoc(getattr(Session, method)), f"Session.{method} has no docstring"
        source = inspect.getsource(commands[command])
        assert re.search(rf"\.{method}(_report|_arrow)?\(", source), f"`tracecal {command}` does not call {method}"


def test_console_scripts_are_commands_with_methods() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"tracecal", *CONSOLE_SCRIPTS}
    for script, command in CONSOLE_SCRIPTS.items():
        assert command in COMMAND_METHODS, script
        assert scripts[script].split(":")[0] == f"tracecal.cli.{command}"


def test_the_api_page_lists_every_method() -> None:
    page = API_PAGE.read_text()
    for method in COMMAND_METHODS.values():
        assert f"`{method}(" in page, f"docs/api.md does not list Session.{method}"


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.DOTALL | re.MULTILINE)


def test_the_walk_through_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """docs/api.md's code blocks, in order, in one namespace, from a scratch directory (``../shared``
    is the shared data beside the checkout). The blocks carry their own asserts."""
    blocks = _python_blocks(API_PAGE)
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "api_walkthrough"}
    for block in blocks:
        exec(compile(block.replace("../shared", str(SHARED)), str(API_PAGE), "exec"), namespace)
    assert (tmp_path / "walkthrough.duckdb").is_file()
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and "no_such_run" in printed[0], printed  # the error block's one line


def test_import_tracecal_loads_neither_the_api_nor_its_libraries() -> None:
    code = (
        "import sys, tracecal; "
        "loaded = [m for m in ('tracecal.api', 'polars', 'duckdb', 'typer') if m in sys.modules]; "
        "assert not loaded, loaded; "
        "print(tracecal.open('/nonexistent/x.duckdb').db_path)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "/nonexistent/x.duckdb"


def test_reading_a_missing_database_is_one_tracecal_error(tmp_path: Path) -> None:
    session = Session(tmp_path / "missing.duckdb")
    with pytest.raises(InputNotFoundError):
        session.runs()
    assert not (tmp_path / "missing.duckdb").exists()


def test_bad_sql_and_bad_options_are_tracecal_errors(tmp_path: Path) -> None:
    session = Session(tmp_path / "x.duckdb")
    assert session.sql("select 1 as one", write=True)["one"].to_list() == [1]  # write: creates the database
    with pytest.raises(TracecalError, match="no_such_table"):
        session.sql("select * from no_such_table")
    with pytest.raises(TracecalError, match="--on-error must be raise or skip"):
        session.ingest(tmp_path, on_error="ignore")
    with pytest.raises(TracecalError, match="needs --cluster"):
        session.predict("any", mode="predicted")
    with pytest.raises(TracecalError, match="give two runs"):
        session.diff("a")


def test_samples_import_calibrate_and_export_through_the_api(tmp_path: Path) -> None:
    """80 rows of published linear2 samples (a forward and a backward sample each): import, calibrate
    gemm, write and read back as Parquet."""
    samples = tmp_path / "compute"
    samples.mkdir()
    published = GPUMODELING25 / "samples" / "perlmutter_a100_compute"
    shutil.copy(published / "NVIDIAA100-SXM4-80GB.csv", samples)
    name = "NVIDIAA100-SXM4-80GB_linear2_fp16.csv"
    (samples / name).write_text("".join((published / name).read_text().splitlines(True)[:81]))
    tc = Session(tmp_path / "s.duckdb")
    with pytest.raises(TracecalError, match="--cluster NAME is required"):
        tc.samples_import(samples)
    overview = tc.samples_import(samples, cluster="perlmutter")
    assert overview["samples"].sum() == 160 and set(overview["direction"]) == {"fwd", "bwd"}
    holdout = tc.calibrate("perlmutter", family="gemm", folds=2)
    fitted = holdout.filter(pl.col("model").is_not_null())
    assert fitted.height >= 1 and (fitted["mape"] >= 0).all()
    assert tc.sql("select count(*) as n from models where cluster = 'perlmutter'")["n"][0] >= 1
    assert tc.samples_export(tmp_path / "s.parquet", cluster="perlmutter") == 160
    other = Session(tmp_path / "other.duckdb")
    assert other.samples_import(tmp_path / "s.parquet", fmt="parquet")["samples"].sum() == 160

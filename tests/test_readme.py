"""The README stays short and true: its command table names commands that exist, with examples whose
options parse, and it links every page of docs/ (sqlite-utils' tests/test_docs.py does the same)."""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 200

_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_CODE = re.compile(r"`([^`]+)`")
_WORD = re.compile(r"^[a-z][a-z0-9-]*$")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _section(text: str, title: str) -> list[str]:
    """The lines of the README section headed ``## title`` (up to the next ``## ``)."""
    lines = text.splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def _command_rows() -> list[tuple[str, str]]:
    """(command cell, example cell) of every row of the README's command table."""
    rows = []
    for line in _section(README.read_text(), "Commands"):
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in _CELL_SPLIT.split(line.strip().strip("|"))]
        rows.append((cells[0], cells[-1]))
    return rows


def _command_path(spelling: str) -> list[str]:
    """``tracecal samples import PATH`` -> ``["tracecal", "samples", "import"]``: the leading words
    up to the first placeholder (upper case), option or argument."""
    words = []
    for word in spelling.split():
        if not _WORD.match(word):
            break
        words.append(word)
    return words


def _scripts() -> dict[str, str]:
    """tracecal's console scripts as installed (``pip install -e .``): name -> ``module:attr``."""
    return {ep.name: ep.value for ep in entry_points(group="console_scripts") if ep.value.startswith("tracecal.")}


def _app(program: str) -> typer.Typer | None:
    """The typer app behind a console script, or None when the script is not a ``typer.Typer``."""
    module, _, attr = _scripts()[program].partition(":")
    target = getattr(importlib.import_module(module), attr)
    return target if isinstance(target, typer.Typer) else None


def _run(argv: list[str]) -> tuple[int, str]:
    """Exit code and output of a console script invoked with ``argv`` (the program name first)."""
    program, args = argv[0], argv[1:]
    assert program in _scripts(), f"{program} is not an installed tracecal console script"
    app = _app(program)
    if app is not None:
        result = CliRunner().invoke(app, args)
        return result.exit_code, result.output
    # a function that builds its own typer app (trace-ingest, calibrate): run it in a child process
    module, _, attr = _scripts()[program].partition(":")
    code = f"import sys; sys.argv[0] = {program!r}; from {module} import {attr}; {attr}()"
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)
    return done.returncode, done.stdout + done.stderr


ROWS = _command_rows()


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_command_table_is_not_empty() -> None:
    assert len(ROWS) >= 10
    assert all(_CODE.search(command) and _CODE.search(example) for command, example in ROWS)


@pytest.mark.parametrize("cell", [command for command, _ in ROWS])
def test_every_command_in_the_table_exists(cell: str) -> None:
    for spelling in _CODE.findall(cell):  # `trace-ingest RUN...` (= `tracecal ingest`): both spellings
        path = _command_path(spelling)
        code, output = _run([*path, "--help"])
        assert code == 0, f"{' '.join(path)} --help failed ({code}):\n{output}"
        assert "Usage" in output


@pytest.mark.parametrize("cell", [example for _, example in ROWS])
def test_every_example_parses(cell: str) -> None:
    """The example's options exist: click handles ``--help`` eagerly, after every option has parsed."""
    argv = shlex.split(_CODE.findall(cell)[0])
    code, output = _run([*argv, "--help"])
    assert code == 0, f"{' '.join(argv)} --help failed ({code}):\n{output}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {Path(target).resolve() for target in _LINK.findall(README.read_text())}
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    missing = [page.name for page in pages if page.resolve() not in linked]
    assert not missing, f"docs pages not linked from README.md: {missing}"


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_local_links_resolve(page: Path) -> None:
    broken = [
        target
        for target in _LINK.findall(page.read_text())
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert not broken, f"{page.name} links to missing files: {broken}"

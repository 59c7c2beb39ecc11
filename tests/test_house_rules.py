"""Rules of the code base that import-linter cannot check: who reads the ``.sql`` files, and that
importing tracecal leaves the process environment alone."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import tracecal
from tracecal.sql.registry import query_names

PACKAGE = Path(tracecal.__file__).parent
LOADER = PACKAGE / "sql" / "registry.py"
GENERATOR = PACKAGE / "schema.py"
"""Writes the table DDL files (``python -m tracecal.schema``); it reads none."""
RUNNER = PACKAGE / "sql" / "query_files.py"
"""Runs a named query given its name (``query_file``, ``query_frame``)."""
SQL_DIRECTORIES = {"queries", "views", "macros", "tables"}
QUERY_CALLS = {"query_text", "query_file", "query_frame"}


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), filename=str(path))) for path in sorted(PACKAGE.rglob("*.py"))]


def _names_sql_files(node: ast.expr) -> bool:
    """A string (or f-string) that is an ``sql/`` directory's name or ends in ``.sql``."""
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[-1]
    text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
    return text is not None and (text in SQL_DIRECTORIES or text.endswith(".sql"))


_PATH_CALLS = {"glob", "rglob", "joinpath", "Path", "open"}


def _sql_paths(tree: ast.Module) -> list[int]:
    """Lines that build a path to ``.sql`` files: ``/ "views"``, ``/ f"{name}.sql"``, ``.glob("*.sql")``,
    ``Path(f"{root}/sql/queries/{name}.sql")``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _names_sql_files(node.right):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and any(_names_sql_files(arg) for arg in node.args):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in _PATH_CALLS:
                lines.append(node.lineno)
    return lines


def test_only_the_registry_knows_where_the_sql_files_are() -> None:
    """A path built into ``sql/queries``, ``sql/views``, ``sql/macros`` or ``sql/tables`` anywhere but
    ``tracecal.sql.registry`` (and the DDL generator, which writes the tables' files) is a second loader."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path, tree in _sources()
        if path not in (LOADER, GENERATOR)
        for line in _sql_paths(tree)
    ]
    assert not offenders, f"read .sql files through tracecal.sql.registry: {offenders}"
    assert _sql_paths(ast.parse(LOADER.read_text())), "the rule sees the registry's own paths"
    for line in ('HERE / "views"', 'QUERIES / f"{name}.sql"', 'VIEWS.glob("*.sql")', 'open(f"{d}/x.sql")'):
        assert _sql_paths(ast.parse(line)) == [1], line


def test_every_query_file_is_loaded_by_name_and_every_name_has_a_file() -> None:
    named: dict[str, list[str]] = {}
    for path, tree in _sources():
        if path in (LOADER, RUNNER):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in QUERY_CALLS:
                name = node.args[1] if node.func.id != "query_text" else node.args[0]
                assert isinstance(name, ast.Constant) and isinstance(name.value, str), (
                    f"{path}:{node.lineno}: name the query with a literal"
                )
                named.setdefault(name.value, []).append(f"{path.name}:{node.lineno}")
    files = set(query_names())
    assert sorted(set(named) - files) == [], "names without a query file"
    assert sorted(files - set(named)) == [], "query files nothing runs"


_IMPORT_EVERYTHING = """
import ast, importlib, json, os, pkgutil, sys
import tracecal
root = os.path.dirname(tracecal.__file__)
names = [m.name for m in pkgutil.walk_packages(tracecal.__path__, "tracecal.") if not m.name.endswith("__main__")]
# the third-party modules tracecal imports at module level first: some set variables of their own
# (polars: its allocator's), which is theirs to do
third_party = set()
for name in names:
    spec = importlib.util.find_spec(name)
    tree = ast.parse(open(spec.origin).read())
    for node in tree.body:
        if isinstance(node, ast.Import):
            third_party.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            third_party.add(node.module)
for module in sorted(m for m in third_party if m.split(".")[0] not in ("tracecal", "__future__")):
    importlib.import_module(module)
before = dict(os.environ)
for name in names:
    importlib.import_module(name)
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps({"modules": len(names), "changed": changed}))
"""


def test_importing_tracecal_changes_no_environment_variable() -> None:
    """Every module of every tracecal package imported in a fresh interpreter: ``os.environ`` is the
    same before and after (calibration's OpenMP policy is set for the libraries' load only)."""
    out = subprocess.run([sys.executable, "-c", _IMPORT_EVERYTHING], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["modules"] > 100
    assert result["changed"] == []


_LOAD_FITTING_LIBRARIES = """
import os
from tracecal.calibrate.estimators import import_sklearn, import_xgboost
import_sklearn("sklearn.ensemble")
import_xgboost()
print(os.environ.get("OMP_WAIT_POLICY"))
"""


def _load_fitting_libraries(**variables: str) -> tuple[str, str]:
    """(the runtime's spin count as libgomp reports it at load, OMP_WAIT_POLICY afterwards)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"OMP_DISPLAY_ENV": "VERBOSE", **variables}
    out = subprocess.run([sys.executable, "-c", _LOAD_FITTING_LIBRARIES], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    spin = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", out.stderr)
    assert len(spin) == 1, "one OpenMP runtime, loaded once"
    return spin[0], out.stdout.strip()


def test_fitting_libraries_load_with_idle_openmp_workers_asleep_and_the_environment_unchanged() -> None:
    """The OpenMP runtime scikit-learn and XGBoost share read PASSIVE when it loaded (it spins 0 times
    before sleeping), and the variable is gone afterwards; a policy the user set is kept."""
    assert _load_fitting_libraries() == ("0", "None")
    spin, after = _load_fitting_libraries(OMP_WAIT_POLICY="ACTIVE")
    assert int(spin) > 0 and after == "ACTIVE"

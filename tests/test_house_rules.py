"""Rules of the code base that import-linter cannot check: who reads ``sql/queries``, and that importing
tracecal leaves the process environment alone."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import tracecal
from tracecal.sql.query_files import QUERIES_DIR

PACKAGE = Path(tracecal.__file__).parent
LOADER = PACKAGE / "sql" / "query_files.py"
QUERY_CALLS = {"query_text", "query_file", "query_frame"}


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), filename=str(path))) for path in sorted(PACKAGE.rglob("*.py"))]


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that stand alone as statements: docstrings, attribute docs."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def test_only_the_query_loader_knows_where_the_query_files_are() -> None:
    """A path into ``sql/queries`` built anywhere but ``tracecal.sql.query_files`` is a second loader."""
    offenders = []
    for path, tree in _sources():
        if path == LOADER:
            continue
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
            if (text == "queries" or "sql/queries" in text) and id(node) not in docs:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not offenders, f"read query files with tracecal.sql.query_files.query_text: {offenders}"


def test_every_query_file_is_loaded_by_name_and_every_name_has_a_file() -> None:
    named: dict[str, list[str]] = {}
    for path, tree in _sources():
        if path == LOADER:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in QUERY_CALLS:
                name = node.args[1] if node.func.id != "query_text" else node.args[0]
                assert isinstance(name, ast.Constant), f"{path}:{node.lineno}: name the query with a literal"
                named.setdefault(name.value, []).append(f"{path.name}:{node.lineno}")
    files = {p.stem for p in QUERIES_DIR.glob("*.sql")}
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

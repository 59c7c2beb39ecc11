"""Golden rows for every view (Perfetto's diff tests): the exact rows each view returns on a shared
fixture, compared with a committed CSV under ``tests/data/golden/``.

The fixture is the dlrm_8rank Kineto run (8 ranks, one iteration, all-to-all and all-reduce) and the
published Perlmutter NCCL samples, both from ``../shared``, loaded through the commands a user runs.
Rows are sorted (views promise no order) and floats written with 9 significant digits.

After a deliberate change, regenerate and review the diff::

    TRACECAL_UPDATE_GOLDEN=1 pytest tests/test_views_golden.py
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import GPUMODELING25, KINETO
from tracecal.cli.main import app
from tracecal.sql.connection import open_database
from tracecal.sql.registry import view_names

GOLDEN = Path(__file__).parent / "data" / "golden"
VIEWS = view_names()
VOLATILE = {"samples_overview": {"last_sampled_at"}}
"""Columns whose value is the time of the import, not a property of the data: left out."""


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory: pytest.TempPathFactory, template_cache: Path) -> Path:
    db = tmp_path_factory.mktemp("golden") / "golden.duckdb"
    env = {"TRACECAL_CACHE_DIR": str(template_cache)}
    runner = CliRunner()
    steps = [
        ["ingest", str(KINETO / "dlrm_8rank"), "--db", str(db)],
        ["samples", "import", str(GPUMODELING25 / "samples" / "perlmutter_a100_nccl"), "--cluster", "perlmutter",
         "--db", str(db)],
    ]  # fmt: skip
    for args in steps:
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 0, result.output
    return db


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, ".9g")
    return str(value)


def _rendered(db: Path, view: str) -> str:
    with open_database(db, read_only=True) as con:
        cursor = con.execute(f"SELECT * FROM {view}")  # names from the views directory
        names = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
    keep = [i for i, name in enumerate(names) if name not in VOLATILE.get(view, set())]
    text_rows = sorted([_cell(row[i]) for i in keep] for row in rows)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([names[i] for i in keep])
    writer.writerows(text_rows)
    return out.getvalue()


def test_every_view_has_a_golden_file() -> None:
    assert VIEWS, "no views found"
    if os.environ.get("TRACECAL_UPDATE_GOLDEN"):
        pytest.skip("regenerating")
    assert sorted(p.stem for p in GOLDEN.glob("*.csv")) == VIEWS


@pytest.mark.parametrize("view", VIEWS)
def test_view_rows_equal_the_golden_rows(fixture_db: Path, view: str) -> None:
    got = _rendered(fixture_db, view)
    path = GOLDEN / f"{view}.csv"
    if os.environ.get("TRACECAL_UPDATE_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert got.count("\n") > 1, f"{view} returns no rows on the fixture: it would test nothing"
    assert got.splitlines() == path.read_text().splitlines()

"""`tracecal demo` end to end on this machine (slow: trains the reference workload)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracecal.cli.main import app

pytestmark = pytest.mark.slow


def test_demo_runs_the_whole_loop(tmp_path: Path) -> None:
    started = time.perf_counter()
    result = CliRunner().invoke(app, ["demo", "--dir", str(tmp_path)])
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    out = result.output
    for stage in ("[1/5] workload", "[2/5] ingest", "[3/5] sample", "[5/5] predict"):
        assert stage in out
    assert "measured-mode replay reproduces every rank within 0.000 %" in out
    assert "| overall |" in out
    assert (tmp_path / "demo.duckdb").stat().st_size > 0
    assert (tmp_path / "figures" / "component_proportions.png").exists()
    assert list((tmp_path / "figures").glob("timeline_rank*.png"))
    assert elapsed < 300, f"demo took {elapsed:.0f} s"

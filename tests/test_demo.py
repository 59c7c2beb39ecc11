"""`tracecal demo` end to end on this machine (slow: trains the reference workload)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracecal.cli.demo import neighbourhood
from tracecal.cli.main import app
from tracecal.samplers.grid import GridPoint
from tracecal.sql.connection import open_database


def test_neighbourhood_is_factorial_and_deduplicated() -> None:
    mm = GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", 256), ("n", 1024), ("k", 256)))
    gelu = GridPoint("elementwise", "aten::gelu", "fwd", "float32", (("tokens", 256), ("hidden", 1024)))
    pts = neighbourhood([mm, mm, gelu])
    assert pts[0] == mm  # the traced shape itself comes first
    assert sum(p.op == "aten::mm" for p in pts) == 27  # 3 dims x {0.5, 1, 2}
    assert sum(p.op == "aten::gelu" for p in pts) == 25  # 2 dims x {0.5, 0.75, 1, 1.5, 2}
    assert GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", 128), ("n", 2048), ("k", 512))) in pts
    assert len(set(pts)) == len(pts)


@pytest.mark.slow
def test_demo_runs_the_whole_loop(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.output
    for stage in ("[1/5] workload", "[2/5] ingest", "[3/5] sample", "[4/5] calibrate", "[5/5] predict"):
        assert stage in out
    assert "measured-mode replay reproduces every rank within 0.000 %" in out
    assert "| overall |" in out
    assert "overall iteration error (slowest rank" in out
    assert (tmp_path / "demo.duckdb").stat().st_size > 0
    # sampled like the workload ran: one process per rank, repeats spread over passes, and the
    # optimizer's per-parameter elementwise calls as themselves
    assert "2 processes at once" in out
    with open_database(tmp_path / "demo.duckdb", read_only=True) as con:
        how = con.execute(
            "SELECT DISTINCT json_extract(params_json, '$.processes')::INT, "
            "json_extract(params_json, '$.passes')::INT, repeats FROM samples"
        ).fetchall()
        ops = {r[0] for r in con.execute("SELECT DISTINCT op FROM samples").fetchall()}
        # the workload's traces drop scalar lists but keep the scalars decode needs: every attention
        # call knows it is causal, so the sampler times it rather than leaving it unmapped
        causal = con.execute("SELECT DISTINCT causal FROM operators WHERE family = 'attention'").fetchall()
        sdpa = {r[0] for r in con.execute("SELECT op FROM samples WHERE family = 'attention'").fetchall()}
    assert how == [(2, 3, 6)]
    assert causal == [(True,)] and sdpa
    assert {"aten::sqrt", "aten::lerp_", "aten::addcdiv_", "aten::addcmul_"} <= ops
    assert (tmp_path / "figures" / "component_proportions.png").exists()
    assert list((tmp_path / "figures").glob("timeline_rank*.png"))
    # its duration is a measured figure (README), not a timed test: the demo prints wall and CPU time
    assert "s wall," in out and "s CPU" in out

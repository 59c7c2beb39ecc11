"""`tracecal diff`: a hand-checkable diff of tiny frames, two workload runs that differ only in hidden size
(the GEMMs must move most), and a run against its replay by a model that doubles one family."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import KINETO
from tracecal.cli.main import app
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.predict import diff as dm
from tracecal.predict.diff_store import diff_predicted, diff_runs
from tracecal.sql.connection import open_database


def _side(label: str, rows: list[tuple[int, str, float, float]], iterations: dict[int, float]) -> dm.Side:
    groups = pl.DataFrame(rows, schema=["rank", "group", "time_ns", "count"], orient="row")
    its = pl.DataFrame({"rank": list(iterations), "iteration_ns": list(iterations.values())})
    return dm.Side(label, groups, its)


def test_tiny_diff_per_rank_means_shares_and_status() -> None:
    # two ranks each; A: gemm 4+6 ms, comm 2+2; B: gemm 8+10, norm 1+1 (comm gone); iterations 10/12 -> 15/17
    a = _side(
        "a", [(0, "gemm", 4e6, 2), (1, "gemm", 6e6, 2), (0, "comm", 2e6, 1), (1, "comm", 2e6, 1)], {0: 10e6, 1: 12e6}
    )
    b = _side(
        "b", [(0, "gemm", 8e6, 2), (1, "gemm", 10e6, 2), (0, "norm", 1e6, 4), (1, "norm", 1e6, 4)], {0: 15e6, 1: 17e6}
    )
    d = dm.diff(a, b, "family")
    assert (d.a_iteration_ms, d.b_iteration_ms, d.iteration_diff_ms) == (11.0, 16.0, 5.0)
    rows = d.table.rows()
    # gemm 5 -> 9 ms per rank (+4: 80 % of +5), comm 2 -> 0 (-2: -40 %), norm 0 -> 1 (+1: 20 %)
    assert rows == [
        ("gemm", 5.0, 9.0, 4.0, 80.0, 2.0, 2.0, "changed"),
        ("comm", 2.0, 0.0, -2.0, -40.0, 1.0, None, "removed"),
        ("norm", 0.0, 1.0, 1.0, 20.0, None, 4.0, "added"),
    ]


def test_equal_iterations_have_no_share() -> None:
    a = _side("a", [(0, "gemm", 1e6, 1)], {0: 2e6})
    b = _side("b", [(0, "gemm", 2e6, 1)], {0: 2e6})
    assert dm.diff(a, b, "family").table["share_pct"].to_list() == [None]


@pytest.fixture(scope="module")
def workload_db(
    tiny_workload: Callable[[int, int], Path], tmp_path_factory: pytest.TempPathFactory, template_cache: Path
) -> Path:
    """One-rank runs at hidden 64 and 512: no pipeline or collective waits to blur what changed."""
    db = tmp_path_factory.mktemp("diff") / "w.duckdb"
    with open_database(db, cache_dir=template_cache) as con:
        for hidden in (64, 512):
            ingest_runs(con, [tiny_workload(1, hidden)], IngestOptions(workers=1, run_id=f"h{hidden}"))
    return db


@pytest.mark.slow
def test_hidden_size_moves_the_gemms_most(workload_db: Path) -> None:
    with open_database(workload_db, read_only=True) as con:
        by_family = diff_runs(con, "h64", "h512", "family")
        by_name = diff_runs(con, "h64", "h512", "name")
        by_component = diff_runs(con, "h64", "h512", "component")
    # 8x the width: 64x the GEMM work, 8x the activations' elementwise work (64x only for the weights')
    top = by_family.table.row(0, named=True)
    assert top["group"] == "gemm" and top["diff_ms"] > 0 and top["share_pct"] > 30
    assert by_family.iteration_diff_ms > 0 and by_family.a_ranks == by_family.b_ranks == 1
    assert by_name.table["group"][0] == "aten::mm"
    # backward runs two GEMMs for each of forward's
    assert by_component.table["group"][0] == "compute_bwd"
    # components split each rank's iteration (idle included): their shares add up to all of it
    assert by_component.table["share_pct"].sum() == pytest.approx(100.0, abs=1e-6)


@pytest.mark.slow
def test_cli_diff_formats_and_bad_input(workload_db: Path) -> None:
    runner = CliRunner()
    table = runner.invoke(app, ["diff", "h64", "h512", "--db", str(workload_db)])
    assert table.exit_code == 0, table.output
    assert "h512 vs h64 by family" in table.output and "gemm" in table.output
    csv = runner.invoke(app, ["diff", "h64", "h512", "--by", "component", "--format", "csv", "--db", str(workload_db)])
    assert csv.exit_code == 0, csv.output
    frame = pl.read_csv(csv.stdout.encode())
    assert tuple(frame.columns) == dm.COLUMNS and frame["group"][0] == "compute_bwd"
    for args, message in {
        ("h64", "nope"): "no run 'nope'",
        ("h64",): "give two runs",
        ("h64", "h512", "--by", "shape"): "unknown --by",
        ("h64", "--predicted"): "has no cluster",
        ("h64", "--predicted", "--cluster", "nowhere"): "calibrate --cluster nowhere",
    }.items():
        result = runner.invoke(app, ["diff", *args, "--db", str(workload_db)])
        assert result.exit_code == 2 and message in result.output, result.output


class DoubleFamily:
    """Predicts twice the measured duration of one family's operators and nothing else (NaN: kept)."""

    def __init__(self, family: str) -> None:
        self.family = family

    def predict(self, rows: pl.DataFrame) -> np.ndarray:
        hit = (rows["family"] == self.family).fill_null(False).to_numpy()
        return np.where(hit, rows["dur_ns"].cast(pl.Float64).to_numpy() * 2.0, np.nan)


def test_predicted_diff_names_the_family_the_model_changed(tmp_path: Path, template_cache: Path) -> None:
    db = tmp_path / "dlrm.duckdb"
    with open_database(db, cache_dir=template_cache) as con:
        ingest_runs(con, [KINETO / "dlrm_8rank"], IngestOptions(workers=1))
        d = diff_predicted(con, "dlrm_8rank", DoubleFamily("gemm"), "family")
        by_component = diff_predicted(con, "dlrm_8rank", DoubleFamily("memcpy"), "component")
    top = d.table.row(0, named=True)
    # the GEMMs take longer; everything else keeps its measured duration
    assert top["group"] == "gemm" and top["b_ms"] > 1.4 * top["a_ms"]
    others = d.table.filter((pl.col("group") != "gemm") & (pl.col("group") != "comm"))
    assert (others["diff_ms"].abs() < 1e-9).all()
    assert d.a == "dlrm_8rank measured" and d.b == "dlrm_8rank predicted"
    # dlrm's GEMMs wait behind its collectives: the iteration does not move, so no group has a share of it
    assert d.iteration_diff_ms == pytest.approx(0.0, abs=1e-9) and d.table["share_pct"].is_null().all()
    # host-to-device copies sit on the critical path: the iteration moves and the shares add up to it
    assert by_component.iteration_diff_ms > 0
    assert by_component.table["share_pct"].sum() == pytest.approx(100.0, abs=1e-6)

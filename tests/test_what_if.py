"""What-if: where a collective's ranks sit, the node size a replay on another cluster uses, the ratios
that scale what the target cluster has no model for, what stays measured, and "change" labels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import GPUMODELING25, KINETO, SHARED_DATA
from tracecal.cli.main import app
from tracecal.decode.topology import group_topology
from tracecal.predict.durations import measured_share
from tracecal.predict.run import predict_iteration
from tracecal.predict.store import load_iteration
from tracecal.predict.what_if import (
    cluster_ratios,
    is_what_if,
    measured_fallback,
    sample_rates,
    target_gpus_per_node,
    uncovered_families,
)
from tracecal.sql.connection import open_database


def _collectives() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "rank": [0, 0, 16, 0],
            "peer": [None, None, 32, None],
            "pg_ranks": ["[0,1,2,3,4,5,6,7]", "[0,16,32,48]", "[0,16,32,48]", None],
        },
        schema={"rank": pl.Int32, "peer": pl.Int32, "pg_ranks": pl.String},
    )


def test_group_topology_places_ranks_node_major() -> None:
    out = group_topology(_collectives(), 4, world_size=64, nodes=16)
    # a TP group of 8 on nodes of 4: 2 x 4; a PP group: 4 x 1; a send spans its two ends only: 2 x 1
    assert out.select("nodes", "gpus_per_node").rows() == [(2, 4), (4, 1), (2, 1), (16, 4)]
    on_one_node = group_topology(_collectives(), 8)
    assert on_one_node.select("nodes", "gpus_per_node").rows()[0] == (1, 8)
    unknown = group_topology(_collectives(), None)
    assert unknown["nodes"].null_count() == unknown.height


def test_target_node_size_comes_from_the_option_then_the_target_samples(tmp_path) -> None:
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    con.execute("CREATE TABLE runs (run_id VARCHAR, cluster VARCHAR)")
    con.execute("CREATE TABLE samples (cluster VARCHAR, family VARCHAR, gpus_per_node INTEGER)")
    con.execute("INSERT INTO runs VALUES ('r', 'a')")
    con.execute("INSERT INTO samples VALUES ('b', 'comm', 1), ('b', 'comm', 2), ('b', 'gemm', 8), ('c', 'gemm', 8)")
    assert target_gpus_per_node(con, "r", "b", 3) == (3, "--gpus-per-node")
    assert target_gpus_per_node(con, "r", "a", None)[0] is None  # its own cluster: as traced
    gpn, source = target_gpus_per_node(con, "r", "b", None)
    assert gpn == 2 and "b's communication samples" in source
    assert target_gpus_per_node(con, "r", "c", None)[0] is None


def test_uncovered_families_are_named() -> None:
    assert uncovered_families({"all": 0.6, "gemm": 1.0, "attention": 0.0, "comm": 0.0}) == ["attention", "comm"]


# --- cross-cluster ratios, measured fallback, change % ----------------------------------------------------

COMPUTE = GPUMODELING25 / "samples" / "perlmutter_a100_compute"
H200_SAMPLES = SHARED_DATA / "gpu" / "h200" / "samples" / "h200_samples.parquet"
DLRM = KINETO / "dlrm_8rank"


@pytest.fixture(scope="module")
def two_clusters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The published A100 GEMM, GELU, residual-add and layer-norm sweeps (perlmutter) and the H200
    samples (h200) in one database."""
    root = tmp_path_factory.mktemp("two_clusters")
    published = root / "perlmutter"
    published.mkdir()
    for name in ("", "_linear1_fp16", "_gelu_fp16", "_res_add_fp16", "_layernorm_fp16"):
        (published / f"NVIDIAA100-SXM4-80GB{name}.csv").symlink_to(COMPUTE / f"NVIDIAA100-SXM4-80GB{name}.csv")
    db = root / "two.duckdb"
    for source, cluster, fmt in ((published, "perlmutter", "gpumodeling25"), (H200_SAMPLES, "h200", "parquet")):
        args = ["samples", "import", str(source), "--cluster", cluster, "--format", fmt, "--db", str(db)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
    return db


def test_cross_cluster_ratios_come_from_the_ops_both_clusters_sampled(two_clusters: Path) -> None:
    with open_database(Path(two_clusters), read_only=True) as con:
        rates = sample_rates(con, "perlmutter", "h200")
    families = ["gemm", "attention", "elementwise", "norm", "memcpy", "optimizer", "comm"]
    ratios = cluster_ratios(rates, "perlmutter", "h200", families)
    # an A100 op takes 0.2-0.7 of its time on an H200: 312 vs 989 dense TFLOP/s, 2.0 vs 4.8 TB/s
    assert 0.2 < ratios["gemm"].factor < 0.5 and "matmul" in ratios["gemm"].basis
    assert ratios["elementwise"].basis == "peak bytes/s of add, gelu samples"  # res_add ~ aten::add
    assert 0.3 < ratios["elementwise"].factor < 0.7 and 0.3 < ratios["norm"].factor < 0.7
    # a family only the source sampled takes its resource class's ratio; collectives need their own
    assert ratios["attention"].factor == ratios["gemm"].factor
    pooled = (ratios["elementwise"].factor * ratios["norm"].factor) ** 0.5
    assert ratios["memcpy"].factor == pytest.approx(pooled) and "elementwise, norm" in ratios["memcpy"].basis
    assert "comm" not in ratios
    # the other way round the ratios invert
    back = cluster_ratios(rates, "h200", "perlmutter", ["gemm"])
    assert back["gemm"].factor == pytest.approx(1 / ratios["gemm"].factor)
    assert cluster_ratios(rates, "perlmutter", "nowhere", families) == {}


def test_a_family_without_a_common_op_compares_its_samples_whole() -> None:
    rates = pl.DataFrame(
        {
            "cluster": ["a", "a", "b"],
            "family": ["softmax"] * 3,
            "op": ["ScaledUpperTriangMaskedSoftmax", "ScaledUpperTriangMaskedSoftmax", "aten::_softmax"],
            "work": [1e6, 2e6, 1e6],
            "rate": [100.0, 100.0, 400.0],
        }
    )
    ratio = cluster_ratios(rates, "a", "b", ["softmax", "memcpy"])
    assert ratio["softmax"].factor == pytest.approx(0.25) and "all softmax" in ratio["softmax"].basis
    assert ratio["memcpy"].factor == pytest.approx(0.25)  # the memory-bound families' ratio


class _GemmOnly:
    """A duration model that covers GEMMs only (at half their measured time)."""

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        return np.where(frame["family"] == "gemm", 0.5 * frame["dur_ns"].to_numpy(), np.nan)


@pytest.fixture(scope="module")
def dlrm(ingested_copy: Callable[..., Path]) -> Path:
    return ingested_copy(DLRM)


def test_uncovered_operators_take_the_ratio_and_the_rest_is_named(dlrm: Path) -> None:
    with open_database(dlrm, read_only=True) as con:
        stored = load_iteration(con, "dlrm_8rank")
    pred = predict_iteration(stored.inputs, mode="predicted", model=_GemmOnly(), fallback={"elementwise": 0.5})
    nodes = pred.graph.nodes
    own = (nodes["duration_role"] == "own").to_numpy()
    family = nodes["family"].to_numpy()
    ratio = own & (family == "elementwise")
    assert (pred.durations.source[ratio] == "ratio").all()
    assert np.array_equal(pred.durations.dur_ns[ratio], np.rint(nodes["dur_ns"].to_numpy()[ratio] * 0.5))
    kept = measured_fallback(pred)
    named = set(kept["what"].to_list())
    # the collectives (all-to-all, all-reduce) and the families nothing covered are named, each once
    assert {"all_to_all unknown", "all_reduce unknown", "memcpy", "optimizer", "total"} <= named
    assert not named & {"gemm", "elementwise"}
    assert ((kept["share_pct"] > 0) & (kept["share_pct"] <= 100)).all()
    parts = kept.filter(pl.col("what") != "total")
    total = kept.filter(pl.col("what") == "total")["share_pct"][0]
    assert parts["share_pct"].max() <= total + 1e-9
    assert 0 < measured_share(pred.graph, pred.durations) < 1


def test_cli_names_what_stayed_measured_and_says_change(dlrm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracecal.api import Session

    monkeypatch.setattr(Session, "duration_model", lambda self, con, cluster: _GemmOnly())
    runner = CliRunner(env={"COLUMNS": "200"})
    out = runner.invoke(app, ["predict", "dlrm_8rank", "--cluster", "gemm-only", "--db", str(dlrm)])
    assert out.exit_code == 0, out.output
    assert "kept their measured durations (no model on cluster gemm-only)" in out.stderr
    assert "all_to_all unknown" in out.stderr and "this prediction is mostly measured time" in out.stderr
    assert "error %" in out.stdout  # the run's own machine, no what-if
    what_if = runner.invoke(
        app,
        [
            "predict",
            "dlrm_8rank",
            "--cluster",
            "gemm-only",
            "--gpus-per-node",
            "4",
            "--format",
            "csv",
            "--db",
            str(dlrm),
        ],
    )
    assert what_if.exit_code == 0, what_if.output
    header = what_if.stdout.splitlines()[0].split(",")
    assert "change_pct" in header and "dependency_change_pct" in header and "error_pct" not in header


def test_what_if_is_a_change_against_the_traced_run() -> None:
    assert is_what_if("scaled", None, None, None)
    assert is_what_if("predicted", "perlmutter", "h200", None)
    assert is_what_if("predicted", "perlmutter", "perlmutter", 8)
    assert not is_what_if("predicted", "perlmutter", "perlmutter", None)
    assert not is_what_if("predicted", None, "local", None)  # a run of unknown machine: scored as an error
    assert not is_what_if("measured", "perlmutter", None, None)

"""Replay fidelity on real traces: dlrm_8rank (8×V100, NCCL) and the reference workload (gloo, CPU).

Measured-mode replay must reproduce every rank's measured best-iteration time within 2 %;
the graph is built so that it does exactly, and these tests would catch any rule that breaks it on
real data (a cycle, a dropped operator, a misplaced span).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import KINETO, NSYS, TinyLayoutRuns
from tracecal.cli.main import app
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.predict.components import ALL_COMPONENTS
from tracecal.predict.run import predict_iteration
from tracecal.predict.store import load_iteration, predict_stored_run, store_prediction
from tracecal.sql.connection import open_database

DLRM = KINETO / "dlrm_8rank"


@pytest.fixture(scope="module")
def dlrm_db(ingested_copy: Callable[..., Path]) -> Path:
    return ingested_copy(DLRM)


def _assert_fidelity(prediction, measured_iteration: pl.DataFrame) -> None:
    it = prediction.iteration_error().join(measured_iteration, on="rank", how="inner")
    assert it.height == measured_iteration.height
    rel = (it["predicted_ns"] - it["measured_iteration_ns"]).abs() / it["measured_iteration_ns"]
    assert (rel <= 0.02).all(), it
    # the components of a rank partition its iteration
    busy = (
        prediction.components.filter(pl.col("component") != "iteration")
        .group_by("rank")
        .agg(pl.col("measured_ns").sum().alias("parts"), pl.col("predicted_ns").sum().alias("p_parts"))
    )
    whole = prediction.components.filter(pl.col("component") == "iteration")
    check = busy.join(whole, on="rank")
    assert ((check["parts"] - check["measured_ns"]).abs() <= 8).all()  # rounding of 10 parts
    assert ((check["p_parts"] - check["predicted_ns"]).abs() <= 8).all()


def test_dlrm_measured_replay_reproduces_every_rank(dlrm_db: Path) -> None:
    with open_database(dlrm_db, read_only=True) as con:
        stored = load_iteration(con, "dlrm_8rank")
    prediction = predict_iteration(stored.inputs)
    assert np.array_equal(prediction.replayed, prediction.graph.measured_times)
    _assert_fidelity(prediction, stored.measured_iteration_ns)
    counts = prediction.graph.edge_counts()
    # every NCCL kernel of the iteration joined its instance on the 8 ranks; stream waits were seen
    assert counts["coll_join"] == 64 and counts["launch"] > 2000 and counts["event_wait"] > 0
    assert set(prediction.components["rank"].to_list()) == set(range(8))


def test_dlrm_faster_compute_shortens_the_iteration(dlrm_db: Path) -> None:
    with open_database(dlrm_db, read_only=True) as con:
        stored = load_iteration(con, "dlrm_8rank")
    base = predict_iteration(stored.inputs)
    fast = predict_iteration(base.graph, mode="scaled", scale={"gemm": 0.1, "elementwise": 0.1})
    slow = predict_iteration(base.graph, mode="scaled", scale={"comm": 2.0})
    it_fast = fast.iteration_error()["predicted_ns"]
    it_slow = slow.iteration_error()["predicted_ns"]
    it_base = base.iteration_error()["predicted_ns"]
    assert (it_fast <= it_base).all() and (it_fast < it_base).any()
    assert (it_slow >= it_base).all() and (it_slow > it_base).any()


def test_stored_results_are_replaced_not_duplicated(dlrm_db: Path, tmp_path: Path, template_cache: Path) -> None:
    with open_database(dlrm_db, cache_dir=template_cache) as con:
        for _ in range(2):
            _, pred = predict_stored_run(con, "dlrm_8rank", mode="measured")
            store_prediction(con, "dlrm_8rank", pred)
        n_comp = con.execute("SELECT count(*) FROM components WHERE run_id = 'dlrm_8rank'").fetchall()[0][0]
        n_pred = con.execute("SELECT count(*) FROM predictions WHERE mode = 'measured'").fetchall()[0][0]
        ops = con.execute(
            "SELECT count(*) FROM operators WHERE run_id = 'dlrm_8rank' AND iteration = "
            "(SELECT iteration FROM best_iteration WHERE run_id = 'dlrm_8rank')"
        ).fetchall()[0][0]
        mode = con.execute("SELECT DISTINCT mode, cluster, replay FROM components ORDER BY replay").fetchall()
        fitted = con.execute(
            "SELECT rank, error_pct, unexplained_ns FROM components WHERE component = 'iteration' "
            "AND replay = 'fitted' ORDER BY rank"
        ).fetchall()
    assert n_comp == 2 * 8 * len(ALL_COMPONENTS)  # the fitted and the dependency replay
    assert n_pred == 2 * ops
    assert mode == [("measured", None, "dependency"), ("measured", None, "fitted")]
    # the fitted replay is exact and some of each rank's iteration is slack it absorbed
    assert all(err == 0 and slack > 0 for _, err, slack in fitted)


def test_cli_predict_csv(dlrm_db: Path) -> None:
    result = CliRunner().invoke(app, ["predict", "dlrm_8rank", "--db", str(dlrm_db), "--format", "csv"])
    assert result.exit_code == 0, result.output
    frame = pl.read_csv(result.stdout.encode())
    assert frame.columns[:5] == ["rank", "component", "measured_ms", "predicted_ms", "error_pct"]
    assert frame.columns[-2:] == ["dependency_error_pct", "unexplained_pct"]
    it = frame.filter(pl.col("component") == "iteration")
    assert it.height == 8 and (it["error_pct"].abs() < 1e-9).all()
    # the graph explains nearly everything: the dependency replay is within 1 % on every rank, and a
    # little of each iteration is slack the fit absorbed (the exact fitted replay hides it)
    assert (it["dependency_error_pct"].abs() < 1).all() and (it["dependency_error_pct"] != 0).any()
    assert ((it["unexplained_pct"] > 0) & (it["unexplained_pct"] < 1)).all()
    comps = frame.filter(pl.col("component").is_in(["iteration", "idle"]).not_())
    by_rank = comps.group_by("rank").agg(pl.col("unexplained_pct").sum()).sort("rank")
    assert (by_rank["unexplained_pct"] <= it.sort("rank")["unexplained_pct"] + 1e-3).all()  # csv: 4 decimals


def test_cli_predict_table_says_which_replay(dlrm_db: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    fitted = runner.invoke(app, ["predict", "dlrm_8rank", "--db", str(dlrm_db), "--scale", "gemm=0.5"])
    assert fitted.exit_code == 0, fitted.output
    assert "scaled, fitted replay" in fitted.output
    # a what-if (scaled durations) is a change against the traced run, not an error
    assert "rank 0: dependency replay change" in fitted.output and "unexplained" in fitted.output
    dep = runner.invoke(app, ["predict", "dlrm_8rank", "--db", str(dlrm_db), "--replay", "dependency"])
    assert dep.exit_code == 0, dep.output
    assert "measured, dependency replay" in dep.output
    with open_database(dlrm_db, read_only=True) as con:
        rows = con.execute(
            "SELECT replay, max(abs(error_pct)) FROM components WHERE mode = 'measured' AND component = 'iteration' "
            "GROUP BY replay ORDER BY replay"
        ).fetchall()
    assert rows[0][0] == "dependency" and 0 < rows[0][1] < 1
    assert rows[1] == ("fitted", 0.0)
    bad = runner.invoke(app, ["predict", "dlrm_8rank", "--db", str(dlrm_db), "--replay", "exact"])
    assert bad.exit_code == 2 and "unknown replay 'exact'" in bad.output


def test_cli_predict_errors_are_one_line(dlrm_db: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["predict", "nope", "--db", str(dlrm_db)])
    assert missing.exit_code == 2 and "no run 'nope'" in missing.output
    bad_scale = runner.invoke(app, ["predict", "dlrm_8rank", "--db", str(dlrm_db), "--scale", "gemm"])
    assert bad_scale.exit_code == 2 and "FAMILY=FACTOR" in bad_scale.output
    unknown = runner.invoke(app, ["predict", "dlrm_8rank", "--db", str(dlrm_db), "--scale", "flux=2"])
    assert unknown.exit_code == 2 and "no operator of family flux" in unknown.output
    no_cluster = runner.invoke(app, ["predict", "dlrm_8rank", "--db", str(dlrm_db), "--mode", "predicted"])
    assert no_cluster.exit_code == 2 and "--cluster" in no_cluster.output


# --- the reference workload, every layout CI trains -----------------------------------------------------


@pytest.fixture(scope="module")
def workload_db(tmp_path_factory: pytest.TempPathFactory, tiny_layouts: TinyLayoutRuns, template_cache: Path) -> Path:
    from tracecal.workload import TINY_LAYOUTS

    dirs = [tiny_layouts(name) for name in TINY_LAYOUTS]
    db = tmp_path_factory.mktemp("workload") / "w.duckdb"
    with open_database(db, cache_dir=template_cache) as con:
        ingest_runs(con, dirs, IngestOptions(workers=1))
    return db


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["pp2", "tp2", "dp2", "pp2tp2"])
def test_workload_measured_replay_reproduces_every_rank(workload_db: Path, layout: str) -> None:
    with open_database(workload_db, read_only=True) as con:
        stored = load_iteration(con, f"gpt_tiny_{layout}")
    prediction = predict_iteration(stored.inputs)
    _assert_fidelity(prediction, stored.measured_iteration_ns)
    comps = prediction.components.filter(pl.col("measured_ns") > 0)["component"].unique().to_list()
    expected = {"pp2": "comm_pp", "tp2": "comm_tp", "dp2": "comm_dp", "pp2tp2": "comm_tp"}[layout]
    assert expected in comps, comps
    if layout == "pp2tp2":
        assert "comm_pp" in comps


def test_cli_validate_markdown_csv_and_figures(dlrm_db: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "errors.md"
    figs = tmp_path / "figs"
    result = runner.invoke(
        app,
        [
            "validate",
            "dlrm_8rank",
            "--db",
            str(dlrm_db),
            "--scale",
            "gemm=0.5",
            "--output",
            str(out),
            "--figures",
            str(figs),
        ],
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "| component | dlrm_8rank |" in text and "| overall |" in text
    pngs = sorted(p.name for p in figs.glob("*.png"))
    assert pngs[0] == "component_proportions.png" and pngs[1].startswith("timeline_dlrm_8rank_rank")
    assert all((figs / p).stat().st_size > 10_000 for p in pngs)
    csv = runner.invoke(app, ["validate", "--db", str(dlrm_db), "--mode", "measured", "--format", "csv"])
    assert csv.exit_code == 0, csv.output
    table = pl.read_csv(csv.stdout.encode())
    assert table.columns == ["component", "dlrm_8rank"]
    overall = table.filter(pl.col("component") == "overall")["dlrm_8rank"][0]
    assert overall == 0.0


OTHER_TRACES = [
    KINETO / "sampled_2_of_128",
    KINETO / "single" / "a100_ddp_rank0_of_2.json.gz",
    KINETO / "single" / "cpu_gloo_rank-34_of_300.pt.trace.json.gz",
    KINETO / "single" / "mi300x_ddp_resnet_rank0_of_8.json.gz",
    KINETO / "single" / "h100_bert_small_inference.json.gz",
    KINETO / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz",
    NSYS / "mfu_2gpu_after.sqlite.gz",
    NSYS / "mock.sqlite.gz",
]


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory: pytest.TempPathFactory, template_cache: Path) -> Path:
    db = tmp_path_factory.mktemp("shared") / "shared.duckdb"
    with open_database(db, cache_dir=template_cache) as con:
        ingest_runs(con, OTHER_TRACES, IngestOptions(workers=1))
    return db


@pytest.mark.slow
@pytest.mark.parametrize("trace", OTHER_TRACES, ids=lambda p: p.name.split(".")[0])
def test_every_shared_trace_replays_exactly(shared_db: Path, trace: Path) -> None:
    """Sampled Kineto (no flows), 2021/2022/2024 schemas, ROCm, CPU-only gloo, inference, Nsight."""
    run_id = trace.name.split(".")[0] if trace.is_file() else trace.name
    with open_database(shared_db, read_only=True) as con:
        stored = load_iteration(con, run_id)
    prediction = predict_iteration(stored.inputs)
    assert np.array_equal(prediction.replayed, prediction.graph.measured_times)
    _assert_fidelity(prediction, stored.measured_iteration_ns)

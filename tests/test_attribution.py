"""Error attribution on a real run (the published Llemma-7B run, rebuilt from its kernel tables): a
family whose durations are doubled as its "prediction" must carry the whole difference, the schedule
must carry the measured replay's error, and the parts must add up to the error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import GPUMODELING25
from tracecal.cli.main import app
from tracecal.errors import PredictionError
from tracecal.predict import attribution as at
from tracecal.predict.replay import replay
from tracecal.predict.run import predict_iteration
from tracecal.predict.store import load_iteration
from tracecal.sources.gpumodeling25.validate.attribution import published_attribution
from tracecal.sources.gpumodeling25.validate.module_times import module_members
from tracecal.sources.gpumodeling25.validate.published_runs import traced_ranks, validate_decoded_run
from tracecal.sql.connection import open_database

LLEMMA = GPUMODELING25 / "runs" / "perlmutter" / "llemma_7B_4_2_2_4_4"
RUN = "llemma_7B_4_2_2_4_4"
runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def llemma_db(ingested_copy: Callable[..., Path]) -> Path:
    return ingested_copy(LLEMMA, cluster="perlmutter")


@pytest.fixture(scope="module")
def stored(llemma_db: Path):
    with open_database(llemma_db, read_only=True) as con:
        return load_iteration(con, RUN)


def _ns(frame: pl.DataFrame, part: str) -> np.ndarray:
    return frame[f"{part}_ns"].fill_null(0.0).to_numpy()


def test_a_family_doubled_carries_the_whole_difference(stored) -> None:
    measured = predict_iteration(stored.inputs, compare=False)
    doubled = predict_iteration(measured.graph, mode="scaled", scale={"gemm": 2.0}, compare=False)
    parts = at.component_attribution(doubled)
    assert at.part_columns(parts) == ["schedule", "family_gemm", "interaction"]
    # the traced run's own components: the fitted measured replay is exact, so no schedule share
    assert np.abs(_ns(parts, "schedule")).max() == 0
    change = (doubled.components["predicted_ns"] - measured.components["predicted_ns"]).to_numpy()
    assert np.array_equal(_ns(parts, "family_gemm"), change)
    assert np.abs(_ns(parts, "interaction")).max() == 0
    it = at.as_percent(parts).filter(pl.col("component") == "iteration")
    assert (it["family_gemm_pct"] > 10).all()  # GEMMs are most of the iteration: doubling them shows
    assert np.allclose(it["family_gemm_pct"], it["error_pct"])


def test_two_families_each_carry_their_own_change(stored) -> None:
    graph = predict_iteration(stored.inputs, compare=False).graph
    both = predict_iteration(graph, mode="scaled", scale={"gemm": 2.0, "comm": 0.5}, compare=False)
    parts = at.component_attribution(both)
    families = [p.removeprefix("family_") for p in at.part_columns(parts) if p.startswith("family_")]
    assert {"gemm", "comm_tp", "comm_dp", "comm_pp"} <= set(families)
    # each share is what that family changes alone, replayed on its own
    alone = predict_iteration(graph, mode="scaled", scale={"gemm": 2.0}, compare=False)
    assert np.array_equal(
        _ns(parts, "family_gemm"), (alone.components["predicted_ns"] - alone.components["measured_ns"]).to_numpy()
    )
    total = sum(_ns(parts, p) for p in at.part_columns(parts))
    assert np.array_equal(total, (parts["predicted_ns"] - parts["measured_ns"]).to_numpy())
    # halved all-reduces shorten the exposed tensor-parallel communication, and that is their share
    tp = parts.filter((pl.col("component") == "comm_tp") & (pl.col("measured_ns") > 0))
    assert tp.height and (tp["family_comm_tp_ns"] < 0).all()


@pytest.mark.parametrize("kind", ["fitted", "dependency"])
def test_replay_many_is_one_replay_per_column(stored, kind: str) -> None:
    graph = predict_iteration(stored.inputs, compare=False).graph
    base = graph.nodes["dur_ns"].to_numpy().astype(np.int64)
    columns = np.column_stack([base, base * 2, base // 3])
    times = at.replay_many(graph, columns, kind)
    for j in range(columns.shape[1]):
        assert np.array_equal(times[:, j], replay(graph, columns[:, j], kind))
    with pytest.raises(PredictionError, match="one row per node"):
        at.replay_many(graph, columns[:-1], kind)


def test_measured_durations_have_nothing_to_attribute(stored) -> None:
    with pytest.raises(PredictionError, match="every duration of this prediction is measured"):
        at.family_replays(predict_iteration(stored.inputs, compare=False))


def test_published_cells_split_into_schedule_and_the_doubled_family(llemma_db: Path) -> None:
    with open_database(llemma_db) as con:
        measured = validate_decoded_run(con, RUN, mode="measured")
        doubled = validate_decoded_run(con, RUN, mode="scaled", scale={"gemm": 2.0})
        members = module_members(con, RUN, doubled.stored.iteration)
        cells = at.as_percent(
            published_attribution(doubled.prediction, members, traced_ranks(con, RUN), doubled.components)
        )
    assert cells["component"].to_list() == doubled.components["component"].to_list()
    parts = at.percent_columns(cells)
    assert parts == ["schedule_pct", "family_gemm_pct", "interaction_pct"]
    scored = cells.filter(pl.col("error_pct").is_not_null())
    assert np.allclose(scored.select(pl.sum_horizontal(parts)).to_series(), scored["error_pct"])
    assert np.allclose(scored["interaction_pct"], 0.0, atol=1e-9)
    # the schedule's share is the measured replay's error of the same cell
    same = scored.join(measured.components.select("component", pl.col("error_pct").alias("m")), on="component")
    overall = same.filter(pl.col("component") == "Overall").row(0, named=True)
    assert overall["schedule_pct"] == pytest.approx(overall["m"], abs=1e-6)
    assert overall["family_gemm_pct"] > 10


@pytest.mark.slow
def test_cli_predict_and_validate_attribute(llemma_db: Path, tmp_path: Path) -> None:
    out = runner.invoke(
        app, ["predict", RUN, "--db", str(llemma_db), "--scale", "gemm=2", "--attribute", "--format", "csv"]
    )
    assert out.exit_code == 0, out.output
    frame = pl.read_csv(out.stdout.encode())
    assert frame.columns[-3:] == ["schedule_pct", "family_gemm_pct", "interaction_pct"]
    # scaled durations are a what-if: the difference to the traced run is a change, split the same way
    summed = frame.filter(pl.col("change_pct").is_not_null()).select(
        (pl.sum_horizontal("schedule_pct", "family_gemm_pct", "interaction_pct") - pl.col("change_pct")).abs().max()
    )
    assert summed.item() < 1e-3  # 4 decimals per column
    table = runner.invoke(
        app, ["predict", RUN, "--db", str(llemma_db), "--scale", "gemm=2", "--attribute", "--figures", str(tmp_path)]
    )
    assert table.exit_code == 0, table.output
    assert "where the change comes from" in table.stdout and (tmp_path / "attribution.png").stat().st_size > 0
    csv = runner.invoke(
        app, ["validate", "--db", str(llemma_db), "--scale", "gemm=2", "--attribute", "--format", "csv"]
    )
    assert csv.exit_code == 0, csv.output
    cells = pl.read_csv(csv.stdout.encode())
    assert cells.columns[:6] == [
        "run_id",
        "component",
        "measured_ms",
        "predicted_ms",
        "error_pct",
        "published_error_pct",
    ]
    assert cells.columns[6:] == ["schedule_pct", "family_gemm_pct", "interaction_pct"]
    refused = runner.invoke(app, ["validate", "--db", str(llemma_db), "--attribute"])
    assert refused.exit_code == 2 and "--attribute" in refused.output

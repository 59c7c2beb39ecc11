"""The dependency replay on real GPU traces (one H200, ``../shared/data/gpu/h200``).

Measured durations, dependency replay (the slack the fit absorbed left out): the graph alone must
reproduce every iteration within 1 % and leave at most 1 % unexplained. Before the stream carry-in,
the first kernel of a GPU-bound iteration (launched while the previous iteration's tail still ran)
started at its launch and the iteration came out 6 % long.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.conftest import SHARED_DATA
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.predict.run import predict_iteration, slack_report
from tracecal.predict.store import load_iteration
from tracecal.sql.connection import open_database

H200 = SHARED_DATA / "gpu" / "h200"


@pytest.fixture(scope="module")
def h200_db(tmp_path_factory: pytest.TempPathFactory, template_cache: Path) -> Path:
    db = tmp_path_factory.mktemp("h200") / "h200.duckdb"
    with open_database(db, cache_dir=template_cache) as con:
        ingest_runs(con, [H200 / "gpt_h2048_l8_bf16", H200 / "demo_tiny"], IngestOptions(workers=1))
    return db


@pytest.mark.slow
@pytest.mark.parametrize("run", ["gpt_h2048_l8_bf16", "demo_tiny"])
def test_the_dependency_replay_holds_on_h200_traces(h200_db: Path, run: str, template_cache: Path) -> None:
    with open_database(h200_db, cache_dir=template_cache) as con:
        stored = load_iteration(con, run)
    assert stored.inputs.carry_in.height >= (1 if run == "gpt_h2048_l8_bf16" else 0)
    report = slack_report(predict_iteration(stored.inputs)).filter(pl.col("component") == "iteration")
    assert report.height == 1
    assert abs(report["dependency_error_pct"].item()) <= 1.0, report
    assert report["unexplained_pct"].item() <= 1.0, report

"""Calibration end to end: import published samples, `calibrate`, the store, `Session.models().predict`, the CLI.

One small calibration (layernorm + two NCCL sweeps of the published Perlmutter data) is shared by the
module; each test checks one behaviour of what it stored.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import GPUMODELING25
from typer.testing import CliRunner

from tracecal.api import Session
from tracecal.calibrate.routing import direction_of
from tracecal.cli.main import app
from tracecal.config import model_store_dir
from tracecal.errors import CalibrationError
from tracecal.sql.connection import open_database
from tracecal.sql.event_store import copy_database

COMPUTE = GPUMODELING25 / "samples" / "perlmutter_a100_compute"
NCCL = GPUMODELING25 / "samples" / "perlmutter_a100_nccl"
FILES = {
    COMPUTE: ["NVIDIAA100-SXM4-80GB.csv", "NVIDIAA100-SXM4-80GB_layernorm_fp16.csv"],
    NCCL: [
        "NVIDIAA100-SXM4-80GB.csv",
        "NVIDIAA100-SXM4-80GB_allgather_large_fp16_4_1.csv",
        "NVIDIAA100-SXM4-80GB_allgather_large_fp16_8_1.csv",
    ],
}
REPORT_COLUMNS = ["op", "direction", "model", "n_train", "n_test", "excluded", "mape", "p90_ape", "published_mape"]

runner = CliRunner()


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("calibrated")
    dirs = []
    for source, names in FILES.items():
        target = root / source.name
        target.mkdir()
        for name in names:
            (target / name).symlink_to(source / name)
        dirs.append(target)
    db = root / "cal.duckdb"
    for d in dirs:
        result = runner.invoke(app, ["samples", "import", str(d), "--cluster", "perlmutter", "--db", str(db)])
        assert result.exit_code == 0, result.output
    report = root / "report.csv"
    args = ["calibrate", "--cluster", "perlmutter", "--db", str(db), "--report", str(report), "--folds", "2"]
    for d in dirs:
        args += ["--published", str(d)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (root / "out.txt").write_text(result.output)
    return {"db": db, "report": report, "output": root / "out.txt"}


@pytest.mark.slow
def test_report_has_contract_columns_and_published_errors(calibrated: dict[str, Path]) -> None:
    report = pl.read_csv(calibrated["report"])
    assert report.columns[: len(REPORT_COLUMNS)] == REPORT_COLUMNS
    rows = {(r["op"], r["direction"]): r for r in report.iter_rows(named=True)}
    assert set(rows) == {
        ("layernorm", "fwd"),
        ("layernorm", "bwd"),
        ("allgather_large_4_1", "fwd"),
        ("allgather_large_8_1", "fwd"),
    }
    assert rows[("layernorm", "fwd")]["published_mape"] == pytest.approx(7.3827, abs=1e-3)
    assert rows[("allgather_large_8_1", "fwd")]["published_mape"] == pytest.approx(0.9656, abs=1e-3)
    assert all(r["n_train"] + r["n_test"] + r["excluded"] in (351, 160, 88) for r in rows.values())
    assert all(r["protocol"] == "published" for r in rows.values())
    output = calibrated["output"].read_text()
    assert "hold-out validation" in output and "lower than published" in output


@pytest.mark.slow
def test_models_table_and_artifacts(calibrated: dict[str, Path]) -> None:
    db = calibrated["db"]
    with open_database(db, read_only=True) as con:
        rows = con.execute(
            "SELECT model_id, family, model_kind, artifact_path, data_fingerprint, mape, published_mape "
            "FROM models WHERE cluster = 'perlmutter' ORDER BY model_id"
        ).fetchall()
    assert len(rows) == 4
    for model_id, _, kind, path, fingerprint, mape, published in rows:
        directory = Path(path)
        assert directory.parent.parent == model_store_dir(db).resolve()
        meta = json.loads((directory / "meta.json").read_text())
        assert meta["data_fingerprint"] == fingerprint and meta["model_kind"] == kind
        assert {"xgboost", "scikit-learn", "numpy"} <= set(meta["versions"])
        assert (directory / "training.parquet").is_file()
        assert (directory / "booster.ubj").is_file() == (kind in ("xgboost", "blend"))
        assert not list(directory.glob("*.pkl")) and not list(directory.glob("*.joblib"))
        assert mape is not None and published is not None, model_id


@pytest.mark.slow
def test_load_predicts_samples_and_traced_rows(calibrated: dict[str, Path]) -> None:
    models = Session(calibrated["db"]).models("perlmutter")
    assert models.families() == ["comm", "norm"]
    rows = pl.DataFrame(
        {
            "family": ["norm", "norm", "comm", "comm", "gemm"],
            "phase": ["fwd", "bwd", None, None, "fwd"],
            "elements": [4 * 2048 * 6144, 4 * 2048 * 6144, None, None, None],
            "hidden": [6144, 6144, None, None, None],
            "dtype": ["float16"] * 5,
            "collective": [None, None, "all_gather", "all_gather", None],
            "size_bytes": [None, None, 2 * 134217728 * 4, 2 * 134217728 * 4, None],
            "group_size": [None, None, 4, 16, None],
            "nodes": [None, None, 4, 4, None],
            "gpus_per_node": [None, None, 1, 4, None],
        }
    )
    predicted = models.predict(rows)
    assert predicted.shape == (5,)
    # layer norm of 50M fp16 elements on an A100: tens to hundreds of µs, backward slower than forward
    assert 2e4 < predicted[0] < 1e6 and predicted[1] > predicted[0]
    # the published 4x1 all_gather of 134217728 elements per rank took 679.5 ms
    assert predicted[2] == pytest.approx(679543.2e3, rel=0.1)
    # no 4x4 all_gather and no gemm model: uncovered, not guessed
    assert np.isnan(predicted[3]) and np.isnan(predicted[4])


def test_direction_follows_the_operator_not_the_phase() -> None:
    assert direction_of("bwd", "gemm", "aten::mm") == "fwd"  # one GEMM of its own shape
    assert direction_of("bwd", "norm", "aten::native_layer_norm_backward") == "bwd"
    assert direction_of("bwd", "elementwise", "aten::add_") == "fwd"  # gradient accumulation is an add
    assert direction_of("bwd", "elementwise", "ViewBackward0") is None  # autograd node: no model
    assert direction_of("bwd", "norm") == "bwd" and direction_of("optimizer", "optimizer") == "fwd"


@pytest.mark.slow
def test_load_refuses_incompatible_or_tampered_artifacts(calibrated: dict[str, Path], tmp_path: Path) -> None:
    db = copy_database(calibrated["db"], tmp_path / "copy.duckdb")
    shutil.copytree(model_store_dir(calibrated["db"]), model_store_dir(db))
    store = model_store_dir(db)
    for path in sorted(store.rglob("meta.json")):
        original = path.read_text()
        meta = json.loads(original)
        training = pl.read_parquet(path.parent / "training.parquet").head(3)
        rows = training.with_columns(phase=pl.col("direction"))
        # stored check predictions that the rebuilt model does not reproduce: refuse to predict
        meta["check"]["predicted_ns"] = [2 * v for v in meta["check"]["predicted_ns"]]
        path.write_text(json.dumps(meta))
        with pytest.raises(CalibrationError, match="does not reproduce its stored predictions"):
            Session(db).models("perlmutter").predict(rows)
        # a forest refitted by another scikit-learn minor version would differ: refuse to load
        meta = json.loads(original)
        meta["versions"]["scikit-learn"] = "0.1.0"
        path.write_text(json.dumps(meta))
        if meta["model_kind"] in ("random_forest", "blend", "local_forest"):
            with pytest.raises(CalibrationError, match=r"scikit-learn 0\.1\.0"):
                Session(db).models("perlmutter")
        path.write_text(original)
        assert np.isfinite(Session(db).models("perlmutter").predict(rows)).all()


def test_unknown_cluster_is_one_line_exit_2(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    with open_database(db):
        pass
    result = runner.invoke(app, ["calibrate", "--cluster", "nowhere", "--db", str(db)])
    assert result.exit_code == 2
    assert "no samples for cluster 'nowhere'" in result.output
    with pytest.raises(CalibrationError, match="no calibrated models for cluster 'nowhere'"):
        Session(db).models("nowhere")


def test_calibrate_has_help() -> None:
    result = runner.invoke(app, ["calibrate", "--help"])
    assert result.exit_code == 0 and "--cluster" in result.output and "--report" in result.output

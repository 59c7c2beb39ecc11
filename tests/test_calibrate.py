"""Calibration: features, estimators, selection and validation protocols (pure parts).

Tiny frames built in code whose expected values a person can check by hand, plus the published
Perlmutter samples (``../shared/data/gpumodeling25``) imported with the real importer.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import GPUMODELING25

from tracecal.calibrate.estimators import DurationRegressor, PhysicalBaseline
from tracecal.calibrate.features import feature_frame, physics_columns, usable_features
from tracecal.calibrate.fitting import (
    ALL_OPS,
    GroupKey,
    calibrate_samples,
    fit_group,
    model_groups,
    worker_processes,
)
from tracecal.calibrate.selection import mape_scale, select_model
from tracecal.calibrate.validation import (
    MIN_SAMPLES,
    Split,
    error_metrics,
    holdout_split,
    noise_level,
    published_rows,
)
from tracecal.errors import CalibrationError

COMPUTE = GPUMODELING25 / "samples" / "perlmutter_a100_compute"
NCCL = GPUMODELING25 / "samples" / "perlmutter_a100_nccl"


def published_subset(tmp_path: Path, source: Path, names: list[str]) -> Path:
    """A directory with links to a few published CSVs (the importer reads whole directories)."""
    target = tmp_path / source.name
    target.mkdir()
    for name in names:
        (target / name).symlink_to(source / name)
    return target


def imported(tmp_path: Path, source: Path, names: list[str], cluster: str = "perlmutter") -> pl.DataFrame:
    from tracecal.samplers.quality import flag_samples
    from tracecal.sources.gpumodeling25.samples.importer import load_gpumodeling25

    table = load_gpumodeling25(published_subset(tmp_path, source, names), cluster)
    return flag_samples(pl.from_arrow(table))  # type: ignore[arg-type]


# --- features ---------------------------------------------------------------------------------------


def test_gemm_features_by_hand() -> None:
    frame = pl.DataFrame(
        {"m": [256, 100], "n": [128, 300], "k": [64, 10], "batch": [None, 3], "dtype": ["float16"] * 2}
    )
    f = feature_frame(frame, "gemm", sm_count=2)
    assert f["batch"].to_list() == [1.0, 3.0]  # a GEMM without batch is one GEMM
    assert f["flops_derived"].to_list() == [2 * 256 * 128 * 64, 2 * 3 * 100 * 300 * 10]
    assert f["bytes_moved"][0] == 2 * (256 * 64 + 64 * 128 + 256 * 128)
    # 256x128 output in 128x128 tiles: 2 tiles, one wave on 2 SMs, full
    assert f["tiles_128x128"][0] == 2 and f["waves_128x128"][0] == 1 and f["wave_fill_128x128"][0] == 1.0
    # 3 GEMMs of 100x300: 3 * 1 * 3 = 9 tiles -> 5 waves on 2 SMs, last wave half empty
    assert f["tiles_128x128"][1] == 9 and f["waves_128x128"][1] == 5 and f["wave_fill_128x128"][1] == 0.9


def test_missing_shape_is_nan_not_zero() -> None:
    f = feature_frame(pl.DataFrame({"m": [None], "n": [4], "k": [4]}, schema_overrides={"m": pl.Int64}), "gemm")
    assert math.isnan(f["flops_derived"][0]) and math.isnan(f["m"][0])


def test_comm_features_ring_steps_and_bus_bytes() -> None:
    frame = pl.DataFrame(
        {
            "collective": ["all_reduce", "all_gather", "send"],
            "size_bytes": [1000, 800, 64],
            "group_size": [4, 8, 2],
            "nodes": [1, 2, 1],
            "gpus_per_node": [4, 4, 2],
        }
    )
    f = feature_frame(frame, "comm")
    assert f["ring_steps"].to_list() == [6.0, 7.0, 1.0]
    assert f["bus_bytes"].to_list() == pytest.approx([1000 * 1.5, 800 * 7 / 8, 64.0])
    assert f["per_rank_bytes"].to_list() == [250.0, 100.0, 32.0]
    assert f["inter_node"].to_list() == [0.0, 1.0, 0.0]


def test_optimizer_features_count_tensors_and_the_baseline_pays_per_tensor() -> None:
    frame = pl.DataFrame({"params": [1000, 1000, None], "batch": [10, 100, 4], "dtype": ["float16"] * 3})
    f = feature_frame(frame, "optimizer")
    assert f["tensors"].to_list() == [10.0, 100.0, 4.0]
    assert f["params_per_tensor"][:2].to_list() == [100.0, 10.0] and math.isnan(f["params_per_tensor"][2])
    assert "tensors" in physics_columns("optimizer") and "tensors" not in physics_columns("norm")
    # same parameters, ten times the tensors: only a per-tensor term tells these apart
    y = np.array([2000.0 + 5 * 1000 + 30 * 10, 2000.0 + 5 * 1000 + 30 * 100])
    base = PhysicalBaseline(physics_columns("optimizer")).fit(f[:2], y)
    assert base.predict(f[:2]) == pytest.approx(y, rel=1e-6)


def test_softmax_features_row_length_padding_and_causal_share() -> None:
    frame = pl.DataFrame({"elements": [8 * 1000, 8 * 1024], "tokens": [8, 8], "hidden": [1000, 1024],
                          "causal": [True, None], "dtype": ["float16"] * 2})  # fmt: skip
    f = feature_frame(frame, "softmax")
    assert f["row_pow2"].to_list() == [1024.0, 1024.0]
    assert f["row_fill"].to_list() == pytest.approx([1000 / 1024, 1.0])
    assert f["padded_elements"].to_list() == [8 * 1024.0, 8 * 1024.0]
    assert f["live_elements"].to_list() == [4000.0, 8192.0]  # a causal mask leaves half each row


def test_usable_features_drop_constant_and_empty_columns() -> None:
    f = pl.DataFrame({"a": [1.0, 2.0], "b": [3.0, 3.0], "c": [float("nan")] * 2})
    assert usable_features(f) == ["a"]


# --- estimators -------------------------------------------------------------------------------------


def synthetic_gemm(n: int = 120, seed: int = 0) -> tuple[pl.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = pl.DataFrame(
        {"m": rng.integers(64, 4096, n), "n": rng.integers(64, 4096, n), "k": rng.integers(64, 4096, n)}
    )
    f = feature_frame(shapes.with_columns(dtype=pl.lit("float16")), "gemm")
    y = 5000.0 + f["flops_derived"].to_numpy() / 1e5 + f["bytes_moved"].to_numpy() / 1e3
    return f, y


def test_physical_baseline_recovers_roofline_coefficients() -> None:
    f, y = synthetic_gemm()
    model = PhysicalBaseline(("flops_derived", "bytes_moved")).fit(f, y)
    assert model.coef_ == pytest.approx([5000.0, 1e-5, 1e-3], rel=1e-4)
    assert np.allclose(model.predict(f), y, rtol=1e-6)


def test_regressor_follows_sklearn_contract() -> None:
    f, y = synthetic_gemm()
    model = DurationRegressor(kind="blend", features=usable_features(f), n_estimators=20, xgb_estimators=20)
    assert not any(name.endswith("_") and not name.startswith("_") for name in vars(model))
    with pytest.raises(CalibrationError, match="not fitted"):
        model.predict(f)
    assert model.fit(f, y) is model
    assert {"baseline_", "forest_", "booster_"} <= set(vars(model))
    assert model.get_params()["kind"] == "blend"
    # the trees correct a perfect baseline by ~nothing
    assert np.allclose(model.predict(f), y, rtol=1e-3)
    clone = DurationRegressor(**model.get_params()).fit(f, y)
    assert np.array_equal(clone.predict(f), model.predict(f))  # fixed seeds: same data, same model


def test_unknown_kind_is_a_calibration_error() -> None:
    f, y = synthetic_gemm(20)
    with pytest.raises(CalibrationError, match="unknown model kind"):
        DurationRegressor(kind="svm").fit(f, y)


# --- selection --------------------------------------------------------------------------------------


def test_mape_scale_is_weighted_median_by_hand() -> None:
    # c = 1: errors 0, 0, 100 %, 0 (sum 1); c = 0.5: 50 %, 50 %, 0, 50 % (sum 1.5)
    assert mape_scale(np.array([10.0, 20.0, 40.0, 10.0]), np.array([10.0, 20.0, 20.0, 10.0])) == 1.0
    assert mape_scale(np.array([5.0, 5.0, 5.0]), np.array([10.0, 10.0, 10.0])) == 2.0


def test_selection_is_deterministic_and_uses_cv() -> None:
    f, y = synthetic_gemm(90)
    y = y * np.exp(np.random.default_rng(1).normal(0, 0.02, len(y)))
    kwargs = {"feature_columns": usable_features(f), "physical_columns": ("flops_derived", "bytes_moved")}
    first = select_model(f, y, **kwargs)
    second = select_model(f, y, **kwargs)
    assert first.params == second.params and first.cv_mape == second.cv_mape
    assert set(first.scores) >= {"physical", "blend"}
    assert first.cv_mape == min(first.scores.values())
    assert first.cv_mape < 5.0  # 2 % noise around a roofline


# --- validation -------------------------------------------------------------------------------------


def test_error_metrics_by_hand() -> None:
    m = error_metrics(np.array([110.0, 90.0, 100.0, 150.0]), np.array([100.0] * 4))
    assert m["mape"] == pytest.approx(17.5) and m["max_ape"] == pytest.approx(50.0) and m["n"] == 4
    assert m["p50_ape"] == pytest.approx(10.0)


def test_published_split_is_the_published_one(tmp_path: Path) -> None:
    """Our hold-out rows are exactly train_test_split(range(n), 0.2, random_state=42) of the CSV rows."""
    from sklearn.model_selection import train_test_split

    samples = imported(tmp_path, COMPUTE, ["NVIDIAA100-SXM4-80GB_linear2_fp16.csv"])
    group = samples.filter(pl.col("direction") == "fwd").sample(fraction=1.0, shuffle=True, seed=3)
    rows = published_rows(group, "perlmutter")
    assert rows is not None and sorted(rows.tolist()) == list(range(351))
    split = holdout_split(group, np.ones(group.height, dtype=bool), "perlmutter")
    _, expected = train_test_split(np.arange(351), test_size=0.2, random_state=42)
    assert split.protocol == "published"
    assert sorted(rows[split.test].tolist()) == sorted(expected.tolist())
    # another cluster name hashes other ids: the split cannot be rebuilt, so it is our own
    assert holdout_split(group, np.ones(group.height, dtype=bool), "elsewhere").protocol == "own"


def test_noise_level_separates_consistent_from_bimodal_sweeps() -> None:
    size = np.repeat(np.linspace(1e6, 1e8, 100), 2)
    smooth = 50.0 + size / 1e4
    split = Split(train=np.arange(0, 200, 2), test=np.arange(1, 200, 2), protocol="own")
    assert noise_level(size, smooth, split) < 0.5
    bimodal = smooth * np.where(np.arange(200) % 4 < 2, 1.0, 20.0)  # 20x apart at equal size
    assert noise_level(size, bimodal, split) > 50.0


def test_too_few_samples_says_so_instead_of_fitting() -> None:
    rows = pl.DataFrame(
        {
            "sample_id": [f"s{i}" for i in range(MIN_SAMPLES - 1)],
            "family": "norm",
            "op": "aten::layer_norm",
            "direction": "fwd",
            "source": "sampler",
            "elements": [float(1000 * (i + 1)) for i in range(MIN_SAMPLES - 1)],
            "median_ns": [float(100 + i) for i in range(MIN_SAMPLES - 1)],
            "quality_flag": None,
        }
    )
    result = fit_group(GroupKey("norm", "fwd", ALL_OPS), rows, "local")
    assert result.status.startswith("too few samples") and result.model is None


def test_flagged_samples_are_excluded_and_counted(tmp_path: Path) -> None:
    samples = imported(tmp_path, COMPUTE, ["NVIDIAA100-SXM4-80GB_layernorm_fp16.csv"])
    fwd = samples.filter(pl.col("direction") == "fwd")
    flagged_ids = fwd["sample_id"].head(5).to_list()
    fwd = fwd.with_columns(
        quality_flag=pl.when(pl.col("sample_id").is_in(flagged_ids)).then(pl.lit("off_trend: test")).otherwise(None)
    )
    (key, group), *_ = model_groups(fwd)
    result = fit_group(key, group, "perlmutter", folds=2)
    assert result.n_excluded == 5
    assert result.n_train + result.n_test == 351 - 5
    assert result.protocol == "published" and result.training is not None
    assert not set(flagged_ids) & set(result.training["sample_id"].to_list())


@pytest.mark.parametrize(
    ("file_op", "direction"), [("ScaledUpperTriangMaskedSoftmax", "fwd"), ("lastStage_optimizer", "fwd")]
)
def test_row_length_and_tensor_count_beat_the_published_holdout(tmp_path: Path, file_op: str, direction: str) -> None:
    """The two groups the shape contract used to lose: with softmax rows × length and the optimizer's
    tensor count, our hold-out error on the published split is below the published one."""
    published = {"ScaledUpperTriangMaskedSoftmax": 4.832945, "lastStage_optimizer": 3.65614}[file_op]
    samples = imported(tmp_path, COMPUTE, [f"NVIDIAA100-SXM4-80GB_{file_op}_fp16.csv"])
    (key, group), *_ = model_groups(samples.filter(pl.col("direction") == direction))
    result = fit_group(key, group, "perlmutter")
    assert result.protocol == "published" and result.status == "ok"
    assert result.metrics["mape"] < published


@pytest.mark.slow
def test_groups_fitted_in_worker_processes_equal_the_serial_fit(tmp_path: Path) -> None:
    """Where the groups are fitted changes nothing: same groups, order, choices, errors and predictions
    (two of the smallest published sweeps, 351 rows each: four groups). Too little work for worker
    processes, so the default fits them here (progress reported as each group starts, from 0); forced,
    they go to worker processes (reported as each finishes, from 1)."""
    samples = imported(
        tmp_path, COMPUTE, ["NVIDIAA100-SXM4-80GB_layernorm_fp16.csv", "NVIDIAA100-SXM4-80GB_RMSlayernorm_fp16.csv"]
    )
    here: list[int] = []
    there: list[tuple[str, int, int]] = []
    serial = calibrate_samples(samples, "perlmutter", folds=2, on_group=lambda key, done, total: here.append(done))
    parallel = calibrate_samples(
        samples,
        "perlmutter",
        folds=2,
        processes=True,
        on_group=lambda key, done, total: there.append((key.label, done, total)),
    )
    assert here == [0, 1, 2, 3]
    assert len(serial) == len(parallel) == 4
    assert [r.key for r in serial] == [r.key for r in parallel]
    assert sorted(done for _, done, _ in there) == [1, 2, 3, 4] and {total for *_, total in there} == {4}
    for one, other in zip(serial, parallel, strict=True):
        assert one.kind == other.kind and one.status == other.status
        assert one.metrics == other.metrics and one.cv_scores == other.cv_scores
        assert one.model is not None and other.model is not None and one.training is not None
        features = feature_frame(one.training, one.key.family)
        assert np.array_equal(one.model.predict(features), other.model.predict(features))


def test_worker_processes_only_where_they_pay() -> None:
    """Worker processes start only when spreading the groups saves more than their start-up: not for a
    few small groups, one group, one job, or one group dominating the rest; for many large groups."""
    assert worker_processes([351] * 4, 2) == 0
    assert worker_processes([5000], 2) == 0
    assert worker_processes([1500] * 60, 1) == 0
    assert worker_processes([4860] + [30] * 3, 2) == 0
    assert worker_processes([1500] * 60, 2) == 2
    assert worker_processes([1500] * 60, 4) == 4


def test_in_trace_report_by_hand() -> None:
    from tracecal.calibrate.in_trace import in_trace_report

    rows = pl.DataFrame(
        {
            "run_id": ["r", "r", "r", "r"],
            "family": ["gemm", "gemm", "norm", "other"],
            "dur_ns": [100, 200, 50, 650],
        }
    )
    report = in_trace_report(rows, np.array([110.0, np.nan, 25.0, np.nan]))
    by_family = {r["family"]: r for r in report.iter_rows(named=True)}
    gemm = by_family["gemm"]
    assert (gemm["operators"], gemm["predicted"]) == (2, 1)
    assert gemm["covered_share"] == pytest.approx(100 / 300) and gemm["mape"] == pytest.approx(10.0)
    assert by_family["norm"]["mape"] == pytest.approx(50.0)
    assert by_family["other"]["predicted"] == 0 and by_family["other"]["mape"] is None
    everything = by_family["all"]
    assert everything["covered_share"] == pytest.approx(150 / 1000)
    assert everything["mape"] == pytest.approx(30.0) and everything["predicted_ms"] == pytest.approx(135e-6)


def test_published_comparison_by_hand() -> None:
    """Compute and comm apart; only groups with both errors; comm's consistent figures only over ok sweeps."""
    import polars as pl

    from tracecal.calibrate.validation import published_comparison

    report = pl.DataFrame(
        {
            "family": ["gemm", "gemm", "norm", "comm", "comm"],
            "mape": [2.0, 6.0, 1.0, 3.0, 9.0],
            "published_mape": [4.0, 5.0, None, 4.0, 8.0],
            "status": ["ok", "ok", "ok", "ok", "inconsistent: noise 30 %"],
        }
    )
    compute, comm = published_comparison(report)
    assert compute == {
        "scope": "compute", "groups": 2, "lower_than_published": 1, "share_lower": 0.5, "median_mape": 4.0,
        "median_published": 4.5, "consistent_groups": 2, "consistent_max_mape": 6.0,
    }  # fmt: skip
    assert (comm["groups"], comm["lower_than_published"], comm["consistent_groups"], comm["consistent_max_mape"]) == (
        2, 1, 1, 3.0,
    )  # fmt: skip
    assert published_comparison(report.filter(pl.col("family") == "norm")) == []

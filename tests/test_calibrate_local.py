"""The local-linear smoother (``tracecal.calibrate.local``) and the ``local`` regressor kinds.

Synthetic sweeps whose right answer is known: a straight line (recovered exactly), noise that
neighbouring sizes share (leave-one-out must pick a small neighbourhood) or not (a wide one), and a
published Perlmutter sweep where the smoother must reach the published hold-out error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from test_calibrate import NCCL, imported
from typer.testing import CliRunner

from tracecal.api import Session
from tracecal.calibrate.estimators import DurationRegressor
from tracecal.calibrate.features import feature_frame, informative_phase, usable_features
from tracecal.calibrate.fitting import GroupKey, fit_group
from tracecal.calibrate.local import K_GRID, MEDIAN, LocalLinear, weighted_median
from tracecal.calibrate.selection import select_model
from tracecal.calibrate.validation import holdout_split
from tracecal.cli.main import app
from tracecal.config import model_store_dir
from tracecal.errors import CalibrationError


def test_a_line_is_recovered_exactly_inside_and_held_at_the_ends() -> None:
    key = np.linspace(0.0, 10.0, 50)
    model = LocalLinear().fit(key, 3.0 + 0.5 * key)
    assert model.k_ in K_GRID
    assert np.allclose(model.predict(np.array([0.3, 5.05, 9.9])), 3.0 + 0.5 * np.array([0.3, 5.05, 9.9]))
    # outside the sampled keys the end value is held, never extrapolated; no key, no value
    assert model.predict(np.array([-100.0, 100.0])) == pytest.approx([3.0, 8.0])
    assert np.isnan(model.predict(np.array([np.nan]))[0])


def test_leave_one_out_follows_the_noise_structure() -> None:
    rng = np.random.default_rng(0)
    key = np.arange(600, dtype=float)
    white = LocalLinear().fit(key, rng.normal(0.0, 0.05, 600))
    # a random walk: neighbours share the noise, so the nearest two are the best predictor
    walk = LocalLinear().fit(key, np.cumsum(rng.normal(0.0, 0.05, 600)))
    assert white.k_ >= 20 and walk.k_ <= 5
    assert white.loo_mape_[(white.kernel_, white.degree_, white.k_)] == min(white.loo_mape_.values())


def test_fixed_k_repeated_keys_and_too_few_rows() -> None:
    key = np.array([1.0, 1.0, 2.0, 2.0, 3.0, 3.0])
    model = LocalLinear(k=2, shapes=[("tricube", 1)]).fit(key, np.array([0.0, 0.2, 1.0, 1.2, 2.0, 2.2]))
    assert model.k_ == 2 and {k for _, _, k in model.loo_mape_} == {2}
    # the two rows at key 2 (equal keys have no slope: their mean)
    assert model.predict(np.array([2.0]))[0] == pytest.approx(1.1)
    with pytest.raises(CalibrationError, match="at least 3 rows"):
        LocalLinear().fit(np.array([1.0, np.nan, 2.0]), np.array([0.0, 1.0, 1.0]))
    with pytest.raises(CalibrationError, match="not fitted"):
        LocalLinear().predict(key)


def test_local_kinds_follow_the_regressor_contract(tmp_path: Path) -> None:
    rows = imported(tmp_path, NCCL, ["NVIDIAA100-SXM4-80GB_allreduce_large_fp16_8_1.csv"])
    y = rows["median_ns"].cast(pl.Float64).to_numpy()
    f = feature_frame(rows, "comm")
    for kind in ("local", "local_forest"):
        model = DurationRegressor(kind=kind, features=usable_features(f), physical_columns=("ring_steps", "bus_bytes"))
        assert model.fit(f, y) is model and hasattr(model, "local_")
        assert hasattr(model, "forest_") == (kind == "local_forest")
        prediction = model.predict(f)
        assert np.mean(np.abs(prediction - y) / y) < 0.01
        clone = DurationRegressor(**model.get_params()).fit(f, y)
        # same data, same model (threaded forests sum their trees in any order: rounding only)
        assert np.allclose(clone.predict(f), prediction, rtol=1e-12)
        # a traced collective without a size gets the baseline alone, not NaN
        assert np.isfinite(model.predict(f.with_columns(pl.lit(None, pl.Float64).alias("log_bus_bytes")))).all()


def test_local_smoother_reaches_the_published_holdout_error(tmp_path: Path) -> None:
    """allreduce 2 nodes × 2 GPUs: the published tuned forest's hold-out MAPE is 0.66 %."""
    rows = imported(tmp_path, NCCL, ["NVIDIAA100-SXM4-80GB_allreduce_fp16_2_2.csv"])
    usable = rows["quality_flag"].is_null().to_numpy()
    split = holdout_split(rows, usable, "perlmutter")
    assert split.protocol == "published"
    data = rows.filter(pl.Series(usable))
    y = data["median_ns"].cast(pl.Float64).to_numpy()
    f = feature_frame(data, "comm")
    model = DurationRegressor(kind="local", features=["log_bus_bytes"], physical_columns=("ring_steps", "bus_bytes"))
    model.fit(f[split.train], y[split.train])
    mape = float(np.mean(np.abs(model.predict(f[split.test]) - y[split.test]) / y[split.test]) * 100)
    assert mape < 0.70


def _sweep(phase_effect: float) -> tuple[pl.DataFrame, np.ndarray]:
    """An 8-rank all_reduce sweep in 128 KiB steps, ±``phase_effect`` by position in a 512 KiB step."""
    size = 20 * 2**20 + 2**17 * np.arange(400)
    frame = pl.DataFrame({"collective": "all_reduce", "size_bytes": size, "nodes": 2, "gpus_per_node": 4})
    step = (size // 2**17) % 4
    noise = np.exp(np.random.default_rng(3).normal(0.0, 0.01, len(size)))
    y = (20_000.0 + size / 100.0) * np.where(np.isin(step, (0, 3)), 1 + phase_effect, 1 - phase_effect) * noise
    return feature_frame(frame, "comm"), y


def test_chunk_phase_feature_and_its_screening() -> None:
    f, flat = _sweep(0.0)
    assert f["chunk_phase"].to_list()[:5] == [0.0, 0.25, 0.5, 0.75, 0.0]  # size mod 512 KiB
    assert f.height == 400 and not informative_phase(f, flat)
    _, stepped = _sweep(0.03)  # the Perlmutter 2×4 all_reduce pattern
    assert informative_phase(f, stepped)
    # a sweep without sizes has no phase to test
    assert not informative_phase(f.with_columns(pl.lit(None, pl.Float64).alias("size_bytes")), stepped)


@pytest.mark.slow
def test_fit_group_uses_the_phase_only_where_the_sweep_shows_it(tmp_path: Path) -> None:
    """allreduce 2 × 4: published hold-out 3.63 %; the phase-aware model must be far below it."""
    results = {}
    for name in ("allreduce_fp16_2_4", "allreduce_large_fp16_1_2"):
        (tmp_path / name).mkdir()
        rows = imported(tmp_path / name, NCCL, [f"NVIDIAA100-SXM4-80GB_{name}.csv"])
        key = GroupKey("comm", "fwd", rows["op"][0], f"{rows['nodes'][0]}x{rows['gpus_per_node'][0]}")
        results[name] = fit_group(key, rows, "perlmutter")
    stepped, flat = results["allreduce_fp16_2_4"], results["allreduce_large_fp16_1_2"]
    assert stepped.params is not None and "chunk_phase" in stepped.params["features"]
    assert stepped.metrics["mape"] < 2.0 and stepped.protocol == "published"
    assert flat.params is not None and "chunk_phase" not in flat.params["features"]


@pytest.mark.slow
def test_a_stored_smoother_is_refitted_exactly_on_load(tmp_path: Path) -> None:
    """allreduce 1 node × 2 GPUs: cross-validation picks a smoother; the store keeps its choice."""
    source = tmp_path / "nccl"
    source.mkdir()
    (source / "NVIDIAA100-SXM4-80GB_allreduce_fp16_1_2.csv").symlink_to(
        NCCL / "NVIDIAA100-SXM4-80GB_allreduce_fp16_1_2.csv"
    )
    db = tmp_path / "cal.duckdb"
    for args in (["samples", "import", str(source)], ["calibrate", "--family", "comm"]):
        result = CliRunner().invoke(app, [*args, "--cluster", "perlmutter", "--db", str(db)])
        assert result.exit_code == 0, result.output
    [meta_path] = model_store_dir(db).rglob("meta.json")
    meta = json.loads(meta_path.read_text())
    assert meta["model_kind"] in ("local", "local_forest")
    assert set(meta["local"]) == {"k", "kernel", "degree"}
    training = pl.read_parquet(meta_path.parent / "training.parquet")
    rows = training.with_columns(phase=pl.col("direction"))
    predicted = Session(db).models("perlmutter").predict(rows)
    assert np.mean(np.abs(predicted - training["median_ns"].to_numpy()) / training["median_ns"].to_numpy()) < 0.01
    # another neighbourhood is another model: the stored check predictions catch it
    original = meta_path.read_text()
    meta["local"]["k"] = meta["local"]["k"] + 7
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CalibrationError, match="does not reproduce its stored predictions"):
        Session(db).models("perlmutter").predict(rows)
    # a smoother this tracecal does not know, or metadata missing a key: one error, not a KeyError
    meta = json.loads(original)
    meta["local"]["kernel"] = "epanechnikov"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CalibrationError, match="cannot refit its stored smoother"):
        Session(db).models("perlmutter").predict(rows)
    meta = json.loads(original)
    del meta["hyperparams"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CalibrationError, match="lacks hyperparams"):
        Session(db).models("perlmutter")
    meta_path.write_text(original)
    # one training duration edited far from the check rows changes the smoother there only: the
    # check predictions cannot see it, the file hash does
    stored_bytes = (meta_path.parent / "training.parquet").read_bytes()
    far = training.with_row_index("i").filter(~pl.col("sample_id").is_in(meta["check"]["sample_ids"]))["i"][-1]
    edited = training.with_columns(
        pl.when(pl.int_range(pl.len()) == far).then(pl.col("median_ns") * 3).otherwise(pl.col("median_ns"))
    )
    edited.write_parquet(meta_path.parent / "training.parquet")
    with pytest.raises(CalibrationError, match=r"training\.parquet is not the training data"):
        Session(db).models("perlmutter").predict(rows)
    (meta_path.parent / "training.parquet").write_bytes(stored_bytes)
    assert np.allclose(Session(db).models("perlmutter").predict(rows), predicted, rtol=1e-9)


def test_unknown_shapes_and_k_are_refused() -> None:
    key = np.arange(10, dtype=float)
    with pytest.raises(CalibrationError, match="unknown local shape"):
        LocalLinear(shapes=[("epanechnikov", 1)]).fit(key, key)
    with pytest.raises(CalibrationError, match="unknown local shape"):
        LocalLinear(shapes=[("tricube", 2)]).fit(key, key)
    with pytest.raises(CalibrationError, match="k >= 1"):
        LocalLinear(k=0).fit(key, key)


def test_weighted_median_shape_for_skewed_noise() -> None:
    # by hand: weights exp(-v) = 1, 0.90, 0.82 -> half of 2.72 is passed at the second value
    assert weighted_median(np.array([[0.2, 0.0, 0.1]]))[0] == pytest.approx(0.1)
    assert weighted_median(np.array([[0.0, np.log(2.0)]]))[0] == 0.0  # 1/y weights favour the faster
    rng = np.random.default_rng(5)
    key = np.arange(800, dtype=float)
    value = 0.001 * key + rng.normal(0.0, 0.005, 800)
    slow = rng.random(800) < 0.1
    value[slow] += 0.5  # sporadic 65 % slower repeats, as a congested network gives
    model = LocalLinear().fit(key, value)
    line = LocalLinear(shapes=[("tricube", 1)]).fit(key, value)
    assert model.kernel_ == MEDIAN
    # off the truth by less than a quarter of what the best local line is (the outliers pull the line)
    truth = 0.001 * key
    assert np.mean(np.abs(model.predict(key) - truth)) < 0.25 * np.mean(np.abs(line.predict(key) - truth))


def test_selection_skips_the_smoother_without_a_usable_key() -> None:
    f, y = _sweep(0.0)
    columns = [c for c in usable_features(f) if c != "log_bus_bytes"]
    selection = select_model(f, y, feature_columns=columns, physical_columns=("ring_steps", "bus_bytes"),
                             candidates=[{"kind": "physical"}, {"kind": "local"}])  # fmt: skip
    assert set(selection.scores) == {"physical"}
    with_key = select_model(f, y, feature_columns=usable_features(f), physical_columns=("ring_steps", "bus_bytes"),
                            candidates=[{"kind": "physical"}, {"kind": "local"}])  # fmt: skip
    assert set(with_key.scores) == {"physical", "local"}

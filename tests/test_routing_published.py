"""Routing of the operators of Megatron/NeoX layers to the published sweeps' models.

Each test pins one defect found on the published Perlmutter runs' A100 kernels: layer norm routed to
the RMSNorm sweep, unsampled element-wise ops borrowing the RoPE sweep, flash-attn decoded in SDPA's
layout, custom-Function backward nodes without a direction, unparsed GEMMs predicted anyway, a
two-kernel op scored twice, a backward bmm landing on another GEMM sweep.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import GPUMODELING25
from typer.testing import CliRunner

from tracecal.api import Session
from tracecal.calibrate.features import feature_frame
from tracecal.calibrate.in_trace import in_trace_report, per_operator
from tracecal.calibrate.routing import CalibratedModels, direction_of, op_kind
from tracecal.calibrate.store import StoredModel
from tracecal.cli.main import app
from tracecal.decode.shape_features import shape_row

COMPUTE = GPUMODELING25 / "samples" / "perlmutter_a100_compute"
SWEEPS = ("layernorm", "RMSlayernorm", "res_add", "gelu", "RoPE", "bmm", "linear3", "ScaledUpperTriangMaskedSoftmax")
HALF = "c10::Half"


def _calibrated(
    root: Path, source: Path, files: list[str], cluster: str, thinned: tuple[str, ...] = ()
) -> CalibratedModels:
    """Models calibrated (2 folds) on a few of the published sample files, linked into ``root``; a
    file in ``thinned`` is copied with every third of its samples."""
    samples = root / "samples"
    samples.mkdir()
    for name in ["NVIDIAA100-SXM4-80GB.csv", *files]:
        if name in thinned:
            header, *rows = (source / name).read_text().splitlines(keepends=True)
            (samples / name).write_text("".join([header, *rows[::3]]))
        else:
            (samples / name).symlink_to(source / name)
    db = root / "cal.duckdb"
    runner = CliRunner()
    result = runner.invoke(app, ["samples", "import", str(samples), "--cluster", cluster, "--db", str(db)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["calibrate", "--cluster", cluster, "--db", str(db), "--folds", "2"])
    assert result.exit_code == 0, result.output
    return Session(db).models(cluster)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> CalibratedModels:
    files = [f"NVIDIAA100-SXM4-80GB_{s}_fp16.csv" for s in SWEEPS]
    # the two 4860-sample sweeps are fitted on a third of their samples: these tests pin where an
    # operator is routed, and compare a prediction with its model's own
    thinned = tuple(f"NVIDIAA100-SXM4-80GB_{s}_fp16.csv" for s in ("RoPE", "bmm"))
    return _calibrated(tmp_path_factory.mktemp("routing"), COMPUTE, files, "perlmutter", thinned)


def _op(name: str, dims: list, family: str, phase: str = "fwd") -> dict:
    row = shape_row(name, dims, [HALF] * len(dims))
    return {"cpu_op_name": name, "family": family, "phase": phase, **row}


def _model(models: CalibratedModels, op: str, direction: str) -> StoredModel:
    return next(m for m in models.models if m.key.op == op and m.key.direction == direction)


def _alone(models: CalibratedModels, op: str, direction: str, rows: pl.DataFrame) -> np.ndarray:
    model = _model(models, op, direction)
    return model.model.predict(feature_frame(rows, model.key.family))


def test_kinds_link_ops_to_their_sweeps() -> None:
    assert op_kind("aten::native_layer_norm") == op_kind("aten::native_layer_norm_backward") == op_kind("layernorm")
    assert op_kind("RMSlayernorm") == op_kind("nn.Module: RMSNorm") == op_kind("aten::rms_norm") == "rms_norm"
    assert op_kind("aten::bmm") == op_kind("bmm") != op_kind("baddbmm")
    assert op_kind("aten::mm") == op_kind("aten::addmm") == op_kind("linear3") == op_kind("linear_final")
    assert op_kind("FlashAttnFuncBackward") == op_kind("flash_atten")
    assert op_kind("ScaledUpperTriangMaskedSoftmaxBackward") == op_kind("ScaledUpperTriangMaskedSoftmax")
    assert op_kind("aten::add_") == op_kind("res_add") and op_kind("RoPE") != op_kind("aten::add")
    assert op_kind("aten::sum") is None and op_kind("aten::fill_") is None and op_kind("fillmask") is None
    # a custom autograd Function's backward node is its op's backward call; aten's nodes do no work
    assert direction_of("bwd", "softmax", "ScaledUpperTriangMaskedSoftmaxBackward") == "bwd"
    assert direction_of("bwd", "attention", "FlashAttnFuncBackward") == "bwd"
    assert direction_of("bwd", "elementwise", "MulBackward0") is None
    assert direction_of("bwd", "other", "_CopyToModelParallelRegionBackward") is None  # no kind


def test_flash_attn_is_decoded_in_dao_layout() -> None:
    q = [4, 4096, 16, 128]  # [batch, seq, heads, head_dim]
    fwd = shape_row("FlashAttnFunc", [q, q, q], [HALF] * 3)
    assert (fwd["batch"], fwd["seq_q"], fwd["seq_k"], fwd["heads"], fwd["head_dim"]) == (4, 4096, 4096, 16, 128)
    bwd = shape_row("FlashAttnFuncBackward", [q], [HALF])  # the node records the output gradient only
    assert (bwd["batch"], bwd["seq_q"], bwd["seq_k"], bwd["heads"], bwd["head_dim"]) == (4, 4096, 4096, 16, 128)
    assert bwd["flops"] == pytest.approx(2.5 * fwd["flops"]) and fwd["causal"] is None
    assert shape_row("ScaledUpperTriangMaskedSoftmax", [[64, 2048, 2048]], [HALF])["causal"] is True


def test_elementwise_bytes_follow_broadcast_reduction_and_fill() -> None:
    x = [4096, 4, 4096]
    assert shape_row("aten::mul", [[4096], x], [HALF] * 2)["io_bytes"] == 2 * (4096 + 2 * 4096 * 4 * 4096)
    assert shape_row("aten::sum", [x, [], [], []], [HALF] * 4)["io_bytes"] == 2 * 4096 * 4 * 4096
    assert shape_row("aten::fill_", [x, []], [HALF] * 2)["io_bytes"] == 2 * 4096 * 4 * 4096
    assert shape_row("aten::add", [x, x, []], [HALF] * 3)["io_bytes"] == 2 * 3 * 4096 * 4 * 4096


def test_unparsed_gemm_has_no_batch_feature() -> None:
    rows = pl.DataFrame(
        [_op("AddmmBackward0", [[8192, 2304]], "gemm"), _op("aten::mm", [[8192, 6144], [6144, 6144]], "gemm")]
    )
    batch = feature_frame(rows, "gemm").get_column("batch").to_list()
    assert np.isnan(batch[0]) and batch[1] == 1.0


@pytest.mark.slow
def test_layer_norm_goes_to_the_layernorm_sweep_and_rms_to_rms(models: CalibratedModels) -> None:
    x = [2048, 4, 6144]
    rows = pl.DataFrame(
        [
            _op("aten::native_layer_norm", [x, [], [6144], [6144], []], "norm"),
            _op("nn.Module: RMSNorm", [x, [6144]], "norm"),
        ]
    )
    predicted = models.predict(rows)
    assert predicted[0] == pytest.approx(_alone(models, "layernorm", "fwd", rows[:1])[0])
    assert predicted[1] == pytest.approx(_alone(models, "RMSlayernorm", "fwd", rows[1:])[0])
    assert predicted[0] != pytest.approx(predicted[1], rel=0.05)
    # the backward is keyed like its forward call: the published sample of this shape took 620.8 us
    bwd = pl.DataFrame(
        [
            _op(
                "aten::native_layer_norm_backward",
                [x, x, [], [2048, 4, 1], [2048, 4, 1], [6144], [6144], []],
                "norm",
                "bwd",
            )
        ]
    )
    assert models.predict(bwd)[0] == pytest.approx(620.8e3, rel=0.1)


@pytest.mark.slow
def test_unsampled_elementwise_ops_never_borrow_the_rope_sweep(models: CalibratedModels) -> None:
    rows = pl.DataFrame(
        [
            _op("aten::sum", [[2048, 4, 6144], [], [], []], "elementwise"),
            _op("aten::fill_", [[2048, 4, 16, 96], []], "elementwise"),
            _op("aten::add", [[2048, 4, 1], [], []], "elementwise"),  # its own kind: the res_add sweep
        ]
    )
    rope_floor = float(_alone(models, "RoPE", "fwd", rows).min())
    predicted = models.predict(rows)
    assert np.isfinite(predicted).all() and (predicted < 0.5 * rope_floor).all()
    baseline = models.unsampled_baseline(("elementwise", "fwd"))
    assert baseline is not None
    floor, per_byte = baseline.coef_
    # launch floor plus bytes over the bandwidth of the single-kernel element-wise sweeps
    assert predicted[0] == pytest.approx(floor + per_byte * rows["io_bytes"][0])
    assert 1e3 < floor < 2e4 and 0.5e12 < 1e9 / per_byte < 3e12
    assert predicted[2] >= floor  # a tiny add stays above the launch floor
    uncovered = CalibratedModels(models.cluster, models.models, unsampled="uncovered").predict(rows)
    assert np.isnan(uncovered[:2]).all() and np.isfinite(uncovered[2])


@pytest.mark.slow
def test_function_backward_nodes_and_gemms(models: CalibratedModels) -> None:
    rows = pl.DataFrame(
        [
            _op("ScaledUpperTriangMaskedSoftmaxBackward", [[64, 2048, 2048]], "softmax", "bwd"),
            _op("AddmmBackward0", [[8192, 2304]], "gemm", "bwd"),  # shapes do not parse: uncovered
            _op("aten::bmm", [[64, 96, 2048], [64, 2048, 2048]], "gemm", "bwd"),  # M = head dim
        ]
    )
    predicted = models.predict(rows)
    softmax = _alone(
        models, "ScaledUpperTriangMaskedSoftmax", "bwd", rows[:1].with_columns(io_bytes=2.0 * 2 * 64 * 2048 * 2048)
    )
    assert predicted[0] == pytest.approx(softmax[0])
    assert np.isnan(predicted[1])
    assert predicted[2] == pytest.approx(_alone(models, "bmm", "fwd", rows[2:])[0])  # not linear3


def test_a_two_kernel_op_is_scored_once() -> None:
    rows = pl.DataFrame(
        {
            "run_id": ["r"] * 3,
            "rank": [0] * 3,
            "cpu_op_event_id": [7, 7, None],
            "family": ["norm", "norm", "other"],
            "dur_ns": [400, 200, 50],
        }
    )
    ops = per_operator(rows)
    assert ops["dur_ns"].to_list() == [600, 50] and ops["kernels"].to_list() == [2, 1]
    report = {r["family"]: r for r in in_trace_report(ops, np.array([660.0, np.nan])).iter_rows(named=True)}
    assert (report["norm"]["kernels"], report["norm"]["operators"], report["norm"]["predicted"]) == (2, 1, 1)
    assert report["norm"]["mape"] == pytest.approx(10.0) and report["norm"]["time_error"] == pytest.approx(10.0)


def _comm_rows(collective: str, sizes: list[float], nodes: int, gpus_per_node: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "family": "comm",
            "collective": collective,
            "size_bytes": sizes,
            "group_size": 2 if collective == "send" else nodes * gpus_per_node,
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "dtype": "float16",
        }
    )


def _window(sweep: pl.DataFrame, asked: float, window: float) -> pl.Series:
    """The sweep's samples (ns) within ``window`` of ``asked``, carried to ``asked`` in proportion."""
    near = sweep.filter((pl.col("bytes") / asked - 1).abs() <= window)
    return near["dur(us)"] * 1e3 * asked / near["bytes"]


def test_traced_collectives_are_predicted_at_their_sweeps_level(tmp_path: Path) -> None:
    """The published all-reduce sweep on 2 nodes x 4 GPUs alternates +-3 % with the size's position in
    NCCL's 512 KiB step, and its sample at exactly a GPT-20B tensor-parallel message (100663296
    bytes) sits in the upper mode; the training run's all-reduces of that size took less than any
    sample around it. A traced collective is predicted at the sweep's level around its size (the
    median of the samples within LEVEL_WINDOW, carried to its size), not at its nearest samples; a
    send (one transfer, whose sample includes the wait for the receiver) at the window's
    TRANSFER_QUANTILE."""
    from tracecal.calibrate.sweep_level import LEVEL_WINDOW, TRANSFER_QUANTILE

    nccl = GPUMODELING25 / "samples" / "perlmutter_a100_nccl"
    allreduce, p2p = "NVIDIAA100-SXM4-80GB_allreduce_fp16_2_4.csv", "NVIDIAA100-SXM4-80GB_p2p_fp16_2_1.csv"
    models = _calibrated(tmp_path, nccl, [allreduce, p2p], "c")
    sweep = pl.read_csv(nccl / allreduce).with_columns((2 * pl.col("shape")).alias("bytes"))
    asked = 100663296.0
    exact = sweep.filter(pl.col("bytes") == asked)["dur(us)"].item() * 1e3
    level = float(_window(sweep, asked, LEVEL_WINDOW).median())  # type: ignore[arg-type]
    quarter = 128 * 1024  # a quarter of the 512 KiB step: the other phase of the pattern
    predicted = models.predict(_comm_rows("all_reduce", [asked, asked + quarter, asked + 2 * quarter], 2, 4))
    assert exact > 1.04 * level  # the sample at that size is in the upper mode
    assert predicted[0] == pytest.approx(level, rel=0.01)
    # the level does not follow the phase pattern: neighbouring sizes in the other mode agree
    assert predicted[1] == pytest.approx(predicted[0], rel=0.01)
    assert predicted[2] == pytest.approx(predicted[0], rel=0.01)

    sends = pl.read_csv(nccl / p2p).with_columns((2 * pl.col("shape")).alias("bytes"))
    asked = 25165824.0  # GPT-20B's activation send
    near = _window(sends, asked, LEVEL_WINDOW)
    low, median = float(near.quantile(TRANSFER_QUANTILE)), float(near.median())  # type: ignore[arg-type]
    (send,) = models.predict(_comm_rows("send", [asked], 2, 1))
    assert send == pytest.approx(low, rel=0.015)
    assert send < 0.95 * median


def test_sweep_level_keeps_the_regressor_where_the_window_is_thin() -> None:
    """Fewer than LEVEL_MIN_SAMPLES samples around a size (a sweep's end, a sparse sweep): the
    regressor's prediction stands; inside, the median ratio to the baseline carries the level."""
    from tracecal.calibrate.estimators import PhysicalBaseline
    from tracecal.calibrate.sweep_level import LEVEL_MIN_SAMPLES, SweepLevel

    sizes = np.linspace(1e8, 1.1e8, 11)
    ratios = np.array([1.0, 1.2, 1.0, 1.2, 1.0, 1.2, 1.0, 1.2, 1.0, 1.2, 1.0])  # an alternating pattern
    training = pl.DataFrame(
        {"collective": "all_reduce", "size_bytes": sizes, "group_size": 8, "nodes": 2, "gpus_per_node": 4}
    )
    features = feature_frame(training, "comm")
    baseline = PhysicalBaseline(("ring_steps", "bus_bytes")).fit(features, sizes / 1e3)
    level = SweepLevel.of(training.with_columns(pl.Series("median_ns", baseline.predict(features) * ratios)), baseline)
    asked = pl.DataFrame(
        {"collective": "all_reduce", "size_bytes": [1.05e8, 1.25e8], "group_size": 8, "nodes": 2, "gpus_per_node": 4}
    )
    fallback = np.array([-1.0, -2.0])
    out = level.predict(feature_frame(asked, "comm"), baseline, fallback)
    assert LEVEL_MIN_SAMPLES <= 11
    assert out[0] == pytest.approx(baseline.predict(feature_frame(asked, "comm"))[0] * 1.0)  # median of the 11
    assert out[1] == -2.0  # no sample within the window of 1.25e8


def test_a_collective_far_outside_its_sweep_stays_uncovered(tmp_path: Path) -> None:
    """Sizes more than SIZE_MARGIN below the smallest (or above the largest) timed message are not
    extrapolated: latency and protocol change with size, so the trace keeps its measured time."""
    from tracecal.calibrate.routing import SIZE_MARGIN

    nccl = GPUMODELING25 / "samples" / "perlmutter_a100_nccl"
    models = _calibrated(tmp_path, nccl, ["NVIDIAA100-SXM4-80GB_p2p_fp16_1_2.csv"], "c")
    sweep = next(m for m in models.models if m.key.family == "comm")
    sizes = sweep.training["size_bytes"]
    lo, hi = float(sizes.min()), float(sizes.max())  # type: ignore[arg-type]
    asked = [22.0, lo / SIZE_MARGIN * 1.01, (lo + hi) / 2, hi * SIZE_MARGIN * 2]
    rows = pl.DataFrame(
        {
            "family": "comm",
            "collective": "send",
            "size_bytes": asked,
            "group_size": 2,
            "nodes": 1,
            "gpus_per_node": 2,
            "dtype": "float16",
            "role": "pp",
        }
    )
    predicted = models.predict(rows)
    assert np.isfinite(predicted).tolist() == [False, True, True, False]

"""Component accounting on hand-checkable intervals: exposed communication, idle, partition of the span."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.test_predict_graph import cpu_pipeline, gpu_two_ranks
from tracecal.errors import PredictionError
from tracecal.predict.components import COMPONENTS, breakdown, run_summary
from tracecal.predict.durations import parse_scale
from tracecal.predict.graph import build_graph
from tracecal.predict.run import predict_iteration


def _idx(name: str) -> int:
    return COMPONENTS.index(name)


def test_breakdown_counts_each_instant_once_by_priority():
    # span [0, 100]: fwd compute [10, 40]; dp all-reduce [30, 70] (hidden 30-40, exposed 40-70);
    # memcpy [65, 80] (hidden behind comm until 70); nothing in [0,10] and [80,100]
    starts = np.array([10, 30, 65])
    ends = np.array([40, 70, 80])
    cats = np.array([_idx("compute_fwd"), _idx("comm_dp"), _idx("memcpy")])
    out = breakdown((0, 100), starts, ends, cats)
    assert out[_idx("compute_fwd")] == 30
    assert out[_idx("comm_dp")] == 30
    assert out[_idx("memcpy")] == 10
    assert out[-1] == 30  # idle
    assert out.sum() == 100


def test_breakdown_clips_to_the_span():
    out = breakdown((10, 20), np.array([0, 15]), np.array([12, 40]), np.array([0, 1]))
    assert out[0] == 2 and out[1] == 5 and out[-1] == 3


def test_gpu_components_measured_and_predicted():
    g = build_graph(gpu_two_ranks())
    p = predict_iteration(g, mode="scaled", scale={"gemm": 0.5})
    rank0 = {r["component"]: r for r in p.components.filter(pl.col("rank") == 0).iter_rows(named=True)}
    # measured rank 0: gemm [15,100] then its all-reduce kernel [100,150]: span 135 ns
    assert rank0["iteration"]["measured_ns"] == 135
    assert rank0["compute_fwd"]["measured_ns"] == 85 and rank0["comm_dp"]["measured_ns"] == 50
    # gemm halves to 42.5 -> 42 (rounded half to even), the collective starts at max(57, 50) and lasts 50
    assert rank0["compute_fwd"]["predicted_ns"] == 42
    assert rank0["iteration"]["predicted_ns"] == 42 + 50
    assert rank0["iteration"]["error_pct"] == pytest.approx((92 - 135) / 135 * 100)
    # rank 1 idles 5 ns between its gemm and its all-reduce kernel; its comm becomes exposed less
    rank1 = {r["component"]: r for r in p.components.filter(pl.col("rank") == 1).iter_rows(named=True)}
    assert rank1["idle"]["measured_ns"] == 5


def test_cpu_pipeline_exposed_comm_and_idle():
    p = predict_iteration(build_graph(cpu_pipeline()))
    r0 = {r["component"]: r["measured_ns"] for r in p.components.filter(pl.col("rank") == 0).iter_rows(named=True)}
    # rank 0, span [0,1000]: compute A, B, C = 100+100+190; c10d::send [120,130] is comm_other until the
    # pp send it enqueued starts at 125 (pp outranks other); exposed pp comm: [125,140] and [240,700]
    # (send, then recv, not hidden by B); idle: [0,10] [110,120] [700,710] [900,1000]
    assert r0["compute_fwd"] == 390
    assert r0["comm_other"] == 5
    assert r0["comm_pp"] == 15 + 460
    assert r0["idle"] == 10 + 10 + 10 + 100
    assert r0["iteration"] == 1000


def test_run_summary_sums_ranks_and_takes_the_slowest_iteration():
    comps = pl.DataFrame(
        {
            "run_id": ["a"] * 4,
            "rank": [0, 0, 1, 1],
            "component": ["compute_fwd", "iteration", "compute_fwd", "iteration"],
            "measured_ns": [10, 100, 30, 120],
            "predicted_ns": [20, 110, 20, 90],
        }
    )
    s = {r["component"]: r for r in run_summary(comps).iter_rows(named=True)}
    assert s["compute_fwd"]["measured_ns"] == 40 and s["compute_fwd"]["predicted_ns"] == 40
    assert s["iteration"]["measured_ns"] == 120 and s["iteration"]["predicted_ns"] == 110


def test_parse_scale():
    assert parse_scale(["gemm=0.5", "comm=2"]) == {"gemm": 0.5, "comm": 2.0}
    for bad in ("gemm", "=2", "gemm=x", "gemm=-1", "gemm=inf"):
        with pytest.raises(PredictionError, match="FAMILY=FACTOR"):
            parse_scale([bad])


class _HalfGemm:
    """A stand-in duration model: covers gemm operators only (half their measured time)."""

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        return np.where(frame["family"].to_numpy() == "gemm", frame["dur_ns"].to_numpy() / 2, np.nan)


def test_predicted_mode_keeps_uncovered_operators_and_reports_coverage():
    g = build_graph(gpu_two_ranks())
    p = predict_iteration(g, mode="predicted", model=_HalfGemm())
    src = dict(zip(g.nodes["name"].to_list(), p.durations.source.tolist(), strict=False))
    assert src["gemm"] == "model" and src["all_reduce"] == "measured"
    # gemm time (85 + 30) is covered; the instance's transfer (50) is not
    assert p.coverage["gemm"] == 1.0 and p.coverage["comm"] == 0.0
    assert p.coverage["all"] == pytest.approx(115 / 165)
    rows = p.predictions.filter(pl.col("family") == "gemm")
    assert rows["duration_source"].to_list() == ["model", "model"]
    with pytest.raises(PredictionError, match="--cluster"):
        predict_iteration(g, mode="predicted")


def test_model_rows_read_the_call_direction_not_the_phase():
    from tracecal.predict.durations import call_direction_expr

    rows = pl.DataFrame(
        {
            "name": ["aten::mm", "aten::gelu_backward", "aten::mm", "Optimizer.step#AdamW.step", "ncclKernel"],
            "cpu_op_name": ["aten::mm", "aten::gelu_backward", None, None, None],
            "family": ["gemm", "elementwise", "gemm", "optimizer", "comm"],
            "phase": ["bwd", "bwd", "fwd", "optimizer", None],
        }
    )
    out = rows.with_columns(call_direction_expr(rows))["phase"].to_list()
    # an mm run by MmBackward0 is one forward mm; a backward op is the forward op's bwd sample
    assert out == ["fwd", "bwd", "fwd", "optimizer", "fwd"]

"""``--from-run``: the traced compute calls of a run become sampler points with the same shapes."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.conftest import KINETO
from tracecal.decode.shape_features import shape_row
from tracecal.errors import RunNotFoundError, SampleError
from tracecal.samplers import cases
from tracecal.samplers.compute import ComputeSettings, sample_compute
from tracecal.samplers.from_run import map_call, run_points
from tracecal.sql.connection import open_database

F, H, D = "float", "c10::Half", "double"

# (family, cpu_op_name, input_dims, input_types, phase, causal) of a tiny training run, built by hand
TRACED = [
    ("gemm", "aten::mm", [[8, 16], [16, 32]], [F, F], "fwd", None),
    ("gemm", "aten::mm", [[8, 16], [16, 32]], [F, F], "fwd", None),  # same call twice: one point
    ("gemm", "aten::linear", [[2, 4, 16], [32, 16], [32]], [F, F, F], "fwd", None),
    ("gemm", "aten::mm", [[8, 32], [32, 16]], [F, F], "bwd", None),  # a gradient mm: just an mm
    ("gemm", "aten::mm", [[4, 4], [4, 4]], [D, D], "fwd", None),  # float64: not sampled
    ("attention", "aten::scaled_dot_product_attention",
     [[1, 2, 16, 8], [1, 2, 16, 8], [1, 2, 16, 8], [], [], [], [], []], [H, H, H, "", "", "", "", ""], "fwd", True),
    ("attention", "aten::_scaled_dot_product_efficient_attention",
     [[1, 2, 16, 8], [1, 2, 16, 8], [1, 2, 16, 8], []], [H, H, H, ""], "fwd", None),  # causality unknown
    ("norm", "aten::native_layer_norm_backward", [[8, 16], [8, 16]], [F, F], "bwd", None),
    ("elementwise", "aten::add", [[8, 16], [16], []], [F, F, "Scalar"], "fwd", None),  # broadcasting
    ("elementwise", "aten::gelu", [[8, 64], []], [F, ""], "fwd", None),
    ("optimizer", "aten::_fused_adamw_", [[[64], [32]], [[64], [32]]], ["TensorList", "TensorList"], "optimizer", None),
    # AdamW without foreach: per-parameter elementwise ops, each sampled as itself
    ("elementwise", "aten::addcdiv_", [[8, 16], [8, 16], [8, 16], []], [F, F, F, "Scalar"], "optimizer", None),
    ("elementwise", "aten::sqrt", [[2, 4, 16]], [F], "optimizer", None),
    ("elementwise", "aten::lerp_", [[8, 16], [16], []], [F, F, "Scalar"], "optimizer", None),  # broadcasting
]  # fmt: skip


def _tiny_run(con: duckdb.DuckDBPyConnection, run_id: str = "tiny") -> None:
    con.execute("INSERT INTO runs (run_id, name, format) VALUES (?, ?, 'kineto')", [run_id, run_id])
    for i, (family, op, dims, types, phase, causal) in enumerate(TRACED):
        con.execute(
            "INSERT INTO operators (run_id, rank, event_id, kind, name, dur_ns, cpu_op_name, input_dims, "
            "input_types, family, phase, causal) VALUES (?, 0, ?, 'cpu_op', ?, 1000, ?, ?, ?, ?, ?, ?)",
            [run_id, i, op, op, json.dumps(dims), json.dumps(types), family, phase, causal],
        )


def test_traced_calls_map_to_points_with_their_shapes_and_reasons_for_the_rest(
    db_path: Path, template_cache: Path
) -> None:
    with open_database(db_path, cache_dir=template_cache) as con:
        _tiny_run(con)
        plan = run_points(con, "tiny", ["float32", "float16"])
    assert plan.training  # the run has a backward phase
    got = {(p.op, p.direction, p.dtype, p.dims) for p in plan.points}
    mm = (("m", 8), ("n", 32), ("k", 16))
    assert got == {
        ("aten::mm", "fwd", "float32", mm),  # GEMMs are modelled per call: no bwd point
        ("aten::linear", "fwd", "float32", (("m", 8), ("n", 32), ("k", 16))),
        ("aten::mm", "fwd", "float32", (("m", 8), ("n", 16), ("k", 32))),
        ("aten::scaled_dot_product_attention", "fwd", "float16",
         (("batch", 1), ("heads", 2), ("seq_q", 16), ("seq_k", 16), ("head_dim", 8), ("causal", True))),
        ("aten::scaled_dot_product_attention", "bwd", "float16",  # the run has a backward phase
         (("batch", 1), ("heads", 2), ("seq_q", 16), ("seq_k", 16), ("head_dim", 8), ("causal", True))),
        ("aten::layer_norm", "bwd", "float32", (("tokens", 8), ("hidden", 16))),  # a backward op: its forward's bwd
        ("aten::add", "fwd", "float32", (("tokens", 1), ("hidden", 16), ("broadcast", 8))),  # a bias row
        ("aten::gelu", "fwd", "float32", (("tokens", 8), ("hidden", 64))),
        ("aten::gelu", "bwd", "float32", (("tokens", 8), ("hidden", 64))),
        ("Optimizer.step#AdamW.step", "fwd", "float32", (("params", 96), ("tensors", 2), ("impl", "fused"))),
        ("aten::addcdiv_", "fwd", "float32", (("tokens", 8), ("hidden", 16))),  # no bwd: not a forward call
        ("aten::sqrt", "fwd", "float32", (("tokens", 8), ("hidden", 16))),
    }  # fmt: skip
    reasons = {op: reason for op, reason in plan.unmapped}
    assert reasons["aten::_scaled_dot_product_efficient_attention"].startswith("causality unknown")
    assert reasons["aten::lerp_"].startswith("broadcasting")
    assert reasons["aten::mm"].startswith("dtype float64 is not sampled")
    # every operator is either covered or listed uncovered by name and reason
    assert plan.total_ns == plan.covered_ns + sum(plan.uncovered.values()) == 1000 * len(TRACED)
    assert plan.uncovered[("aten::mm", "dtype float64 is not sampled (only float32, float16, bfloat16)")] == 1000
    mm_fwd = next(p for p in plan.points if p.op == "aten::mm" and p.dims == mm and p.direction == "fwd")
    assert plan.params_for(mm_fwd) == {
        "from_run": "tiny", "traced_ops": ["aten::mm"], "traced_phases": ["fwd"], "traced_operators": 2,
    }  # fmt: skip


def test_sample_shape_columns_join_the_traced_operators(db_path: Path) -> None:
    """For every point, the sample's shape columns equal decode's on the traced call it stands for."""
    for family, op, dims, types, _, causal in TRACED:
        point = map_call(op, dims, types, causal, "float32")
        if isinstance(point, str):
            continue
        traced = shape_row(op, dims, types, ["", "", "", "", "", "True"] if causal else None)
        sampled = cases.shape_columns(point)
        keys = {
            "gemm": ("batch", "m", "n", "k", "flops", "dtype"),
            "attention": ("batch", "heads", "seq_q", "seq_k", "head_dim", "causal", "flops", "dtype"),
            "elementwise": ("elements", "dtype"),
            "norm": ("elements", "dtype"),
            "optimizer": ("params",),
        }[family]
        assert {k: sampled[k] for k in keys} == {k: traced[k] for k in keys}, op


def test_without_dtype_a_fused_optimizer_call_is_reported_not_guessed() -> None:
    reason = map_call("aten::_fused_adam_", [[[64]], [[64]]], ["TensorList", "TensorList"], None)
    assert isinstance(reason, str) and "pass --dtype" in reason


def test_unknown_run_and_run_without_compute_ops(db_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache) as con:
        _tiny_run(con)
        with pytest.raises(RunNotFoundError, match=r"run 'nope' is not in the database \(runs: tiny\)"):
            run_points(con, "nope")
        con.execute("INSERT INTO runs (run_id, name, format) VALUES ('empty', 'empty', 'kineto')")
        with pytest.raises(SampleError, match="run 'empty' has no compute operators"):
            run_points(con, "empty")


@pytest.mark.slow
def test_from_run_samples_the_gemm_shapes_of_an_ingested_shared_trace(db_path: Path, template_cache: Path) -> None:
    """BERT inference on an H100 (bf16): after ingest, every traced GEMM shape is sampled on this CPU,
    and samples join the operators table on the shape columns."""
    from tracecal.pipeline.ingest import IngestOptions, ingest_runs

    trace = KINETO / "single" / "h100_bert_small_inference.json.gz"
    with open_database(db_path, cache_dir=template_cache) as con:
        ingest_runs(con, [trace], IngestOptions(run_id="bert", workers=1))
        plan = run_points(con, "bert")
        assert all(p.direction == "fwd" for p in plan.points) and not plan.training  # inference
        settings = ComputeSettings(cluster="local", warmup=0, repeats=2, source_file="run:bert", autograd=plan.training)
        report = sample_compute(con, plan.points, settings, extra_params=plan.params_for)
        assert report.written == len(plan.points) and not report.skipped
        traced = con.execute(
            "SELECT DISTINCT batch, m, n, k, dtype FROM operators WHERE run_id = 'bert' AND family = 'gemm'"
        ).fetchall()
        sampled = con.execute(
            "SELECT DISTINCT batch, m, n, k, dtype FROM samples WHERE family = 'gemm' AND cluster = 'local'"
        ).fetchall()
        assert len(traced) == 4 and sorted(sampled) == sorted(traced)
        params = [r[0] for r in con.execute("SELECT params_json FROM samples").fetchall()]
        assert all('"autograd":false' in p and '"from_run":"bert"' in p for p in params)
        joined = con.execute(
            "SELECT count(*) FROM operators o JOIN samples s USING (family, batch, m, n, k, dtype) "
            "WHERE o.run_id = 'bert' AND o.family = 'gemm'"
        ).fetchall()
        assert joined == [(26,)]  # every traced GEMM kernel finds its sample
        norm = con.execute("SELECT count(*) FROM samples WHERE family = 'norm' AND hidden = 512").fetchall()
        assert norm == [(1,)]
        assert sample_compute(con, plan.points, settings).written == 0

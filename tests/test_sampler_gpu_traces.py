"""Sampling the real H200 traces (../shared/data/gpu/h200): every op family of a GPU training step has
a sampler, the planned points cover the best iteration's GPU time, and the in-trace check scores an
optimizer step as the whole step the sampler times."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import numpy as np
import orjson
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import SHARED_DATA
from tracecal.calibrate.in_trace import traced_rows
from tracecal.calibrate.routing import op_kind
from tracecal.cli.main import app
from tracecal.decode.shape_features import kernel_element_bytes, shape_row
from tracecal.samplers import cases
from tracecal.samplers.compute import ComputeSettings, sample_compute
from tracecal.samplers.from_run import map_call, run_points
from tracecal.samplers.plan import compute_plan
from tracecal.schema import SHAPE_COLUMNS
from tracecal.sql.connection import open_database
from tracecal.sql.event_store import copy_database
from tracecal.sql.samples import read_samples

H200 = SHARED_DATA / "gpu" / "h200"
RUNS = ("gpt_h2048_l8_bf16", "demo_tiny")


@pytest.fixture(scope="module")
def h200_db(ingested_copy: Callable[..., Path]) -> Path:
    """Both shared H200 traces ingested once, as cluster h200."""
    return ingested_copy(*(H200 / run for run in RUNS), cluster="h200")


@pytest.fixture
def con(h200_db: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with open_database(h200_db, read_only=True) as c:
        yield c


@pytest.mark.parametrize("run", RUNS)
def test_planned_points_cover_the_gpu_time_of_both_h200_traces(con: duckdb.DuckDBPyConnection, run: str) -> None:
    plan = run_points(con, run)
    assert plan.gpu and plan.coverage is not None and plan.coverage >= 0.98
    # what is left is named, with its reason, and adds up
    assert plan.total_ns == plan.covered_ns + sum(plan.uncovered.values())
    assert all(name and reason for name, reason in plan.uncovered)
    expected = json.loads((H200 / run / "run.json").read_text())["ranks"][0]["parameters"]
    step = [p for p in plan.points if p.family == "optimizer"]
    # one AdamW step over exactly the model's parameters, foreach as traced, fp32 as the parameters
    assert [(p.op, p.dim("params"), p.dim("impl"), p.dtype) for p in step] == [
        ("Optimizer.step#AdamW.step", expected, "foreach", "float32")
    ]
    attention = {(p.op, p.direction, p.dtype, p.dim("causal")) for p in plan.points if p.family == "attention"}
    backend, dtype = {"gpt_h2048_l8_bf16": ("cudnn", "bfloat16"), "demo_tiny": ("efficient", "float32")}[run]
    op = f"aten::_scaled_dot_product_{backend}_attention"
    assert attention == {(op, "fwd", dtype, True), (op, "bwd", dtype, True)}
    families = {p.family for p in plan.points}
    assert {"gemm", "attention", "softmax", "norm", "elementwise", "embedding", "loss", "optimizer"} <= families
    ops = {(p.op, p.direction) for p in plan.points}
    assert {("aten::log_softmax", "bwd"), ("aten::nll_loss", "bwd"), ("aten::embedding", "bwd"),
            ("aten::sum", "fwd"), ("aten::cat", "fwd"), ("aten::gather", "fwd")} <= ops  # fmt: skip


def test_traced_dtypes_and_casts_come_from_the_trace(con: duckdb.DuckDBPyConnection) -> None:
    plan = run_points(con, "gpt_h2048_l8_bf16")
    by_op = {}
    for p in plan.points:
        by_op.setdefault((p.family, p.op), set()).add(p.dtype)
    assert by_op[("gemm", "aten::mm")] == {"bfloat16"}  # autocast GEMMs
    assert by_op[("norm", "aten::layer_norm")] == {"float32"}  # autocast runs layer norm in fp32
    casts = {(p.dtype, p.dim("src_dtype")) for p in plan.points if p.op == "aten::copy_"}
    assert {("bfloat16", "float32"), ("float32", "bfloat16")} <= casts  # both directions of the casts
    cat = next(p for p in plan.points if p.op == "aten::cat" and p.dim("tensors") == 3)
    assert cat.dtype == "bfloat16"  # a TensorList: its kernel moved 2-byte elements in a bf16 run
    bias = [p for p in plan.points if p.op == "aten::add" and p.dim("broadcast")]
    assert any(p.dim("tokens") == 1 and p.dim("other_dtype") == "float32" for p in bias)  # fp32 bias on bf16


def test_traced_casts_and_their_samples_have_the_same_features_and_differ_from_copies(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """Every element-wise call of the bf16 H200 trace that a sampler re-runs gets, as a sample, the
    very shape columns its operator row has (io_bytes included): a cast counts each tensor at its
    own dtype, a cat the element size its kernel names; so a cast is not a same-dtype copy."""
    traced = con.execute(
        "SELECT DISTINCT o.cpu_op_name, o.input_dims, o.input_types, e.concrete_inputs, o.name, "
        f"{', '.join(c.name for c in SHAPE_COLUMNS)} FROM operators o JOIN events e ON e.run_id = o.run_id "
        "AND e.event_id = o.cpu_op_event_id WHERE o.run_id = 'gpt_h2048_l8_bf16' AND o.family = 'elementwise' "
        "AND o.kind = 'kernel'"
    ).fetchall()
    compared: dict[str, set[tuple[str, ...]]] = {}
    for name, dims, types, concrete, kernel, *columns in traced:
        size = kernel_element_bytes(kernel)
        list_dtype = {2: "bfloat16", 4: "float32"}.get(size) if size else None
        point = map_call(
            name, orjson.loads(dims), orjson.loads(types), None, list_dtype, concrete=orjson.loads(concrete)
        )
        if isinstance(point, str) or point.direction == "bwd":  # a bwd sample has its forward's columns
            continue
        row = dict(zip([c.name for c in SHAPE_COLUMNS], columns, strict=True))
        row["dtype"] = row["dtype"] or list_dtype  # a TensorList's dtype: the sample's, as above
        assert cases.shape_columns(point) == row, (name, dims, types)
        compared.setdefault(name, set()).add(tuple(orjson.loads(types)))
    assert {"aten::copy_", "aten::add", "aten::add_", "aten::cat", "aten::sum", "aten::fill_"} <= set(compared)
    # both directions of the autocast casts were compared; a cast and a same-dtype copy of one shape differ
    assert {("c10::BFloat16", "float", "Scalar"), ("float", "c10::BFloat16", "Scalar")} <= compared["aten::copy_"]
    x = [4, 1024, 2048]
    cast, copy = (shape_row("aten::copy_", [x, x, []], [t, src, "Scalar"]) for t, src in
                  (("c10::BFloat16", "float"), ("c10::BFloat16", "c10::BFloat16")))  # fmt: skip
    assert (cast["io_bytes"], copy["io_bytes"]) == (6 * 4 * 1024 * 2048, 4 * 4 * 1024 * 2048)


def test_from_run_samples_the_neighbourhood_unless_exact(con: duckdb.DuckDBPyConnection) -> None:
    exact = compute_plan(con, from_run="demo_tiny", exact=True)
    around = compute_plan(con, from_run="demo_tiny")
    assert set(exact.points) < set(around.points)
    mm = [p for p in around.points if p.op == "aten::mm"]
    assert len(mm) >= 20 * len([p for p in exact.points if p.op == "aten::mm"]) // 27  # 3^3 per traced GEMM shape


@pytest.mark.slow
def test_new_family_samplers_run_on_cpu_and_join_the_traced_calls(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    """The traced calls of the fp32 H200 demo, sampled on this CPU: every point is timed except the
    CUDA-only attention backend, skipped with torch's reason; each sample's shape columns are
    decode's for the traced call it stands for."""
    plan = run_points(con, "demo_tiny")
    settings = ComputeSettings(cluster="cpu", warmup=0, repeats=1, source_file="run:demo_tiny", autograd=True)
    with open_database(tmp_path / "cpu.duckdb") as scratch:
        report = sample_compute(scratch, plan.points, settings, extra_params=plan.params_for)
        rows = scratch.execute("SELECT op, direction, params_json FROM samples").fetchall()
    assert {p.op for p, _ in report.skipped} == {"aten::_scaled_dot_product_efficient_attention"}
    assert report.written == len(plan.points) - len(report.skipped) == len(rows)
    written = {(op, direction) for op, direction, _ in rows}
    assert {("aten::nll_loss", "bwd"), ("aten::log_softmax", "bwd"), ("Optimizer.step#AdamW.step", "fwd"),
            ("aten::embedding", "bwd"), ("aten::cat", "fwd"), ("aten::sum", "fwd")} <= written  # fmt: skip
    step = next(json.loads(p) for op, _, p in rows if op.startswith("Optimizer"))
    assert step["implementation"] == "foreach" and "aten::_foreach_addcdiv_" in step["traced_ops"]
    traced = con.execute(
        "SELECT DISTINCT o.cpu_op_name, o.input_dims, o.input_types, e.concrete_inputs FROM operators o "
        "JOIN events e ON e.run_id = o.run_id AND e.event_id = o.cpu_op_event_id WHERE o.run_id = 'demo_tiny' "
        "AND o.cpu_op_name IN ('aten::_log_softmax', 'aten::nll_loss_forward', 'aten::gather', 'aten::sum', "
        "'aten::copy_', 'aten::add')"
    ).fetchall()
    for name, dims, types, concrete in traced:
        point = map_call(name, orjson.loads(dims), orjson.loads(types), None, concrete=orjson.loads(concrete))
        if isinstance(point, str):
            continue
        sampled, decoded = cases.shape_columns(point), shape_row(name, dims, types)
        assert sampled["elements"] == decoded["elements"] and sampled["dtype"] == decoded["dtype"], name


def test_plan_prints_points_and_coverage_and_times_nothing(h200_db: Path, tmp_path: Path) -> None:
    db = copy_database(h200_db, tmp_path / "copy.duckdb")
    runner = CliRunner()
    result = runner.invoke(
        app, ["samples", "measure", "compute", "--cluster", "h200", "--from-run", "gpt_h2048_l8_bf16", "--plan",
              "--db", str(db)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    line = re.search(r"^coverage: (\d+\.\d) % of GPU operator time", result.output, re.M)
    assert line and float(line.group(1)) >= 98.0
    assert "Optimizer.step#AdamW.step" in result.output and "aten::_scaled_dot_product_cudnn_attention" in result.output
    assert re.search(r"aten::div\s+only scalar \(0-d\) tensors", result.output)  # uncovered, by name
    with open_database(db, read_only=True) as c:
        assert c.execute("SELECT count(*) FROM samples").fetchall() == [(0,)]


def test_in_trace_scores_an_optimizer_step_as_one_operator(con: duckdb.DuckDBPyConnection) -> None:
    rows = traced_rows(con, "h200")
    steps = rows.filter(rows["cpu_op_name"] == "Optimizer.step#AdamW.step")
    gpt = steps.filter(steps["run_id"] == "gpt_h2048_l8_bf16")
    assert gpt.height == 6  # one per profiled step, each all of its kernels
    assert set(gpt["params"].to_list()) == {536039424} and set(gpt["batch"].to_list()) == {101}
    assert (gpt["kernels"] > 100).all() and set(gpt["family"].to_list()) == {"optimizer"}
    # an operator is the family of its longest kernel: no mm is scored as the memset it issued first
    mm = rows.filter((rows["cpu_op_name"] == "aten::mm") & (rows["run_id"] == "gpt_h2048_l8_bf16"))
    assert set(mm["family"].to_list()) == {"gemm"}


def test_traced_backend_and_loss_ops_meet_their_samplers_op_kind() -> None:
    pairs = {
        "aten::_cudnn_attention_backward": "aten::_scaled_dot_product_cudnn_attention",
        "aten::_efficient_attention_forward": "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu": "aten::_scaled_dot_product_flash_attention",
        "aten::_log_softmax_backward_data": "aten::log_softmax",
        "aten::nll_loss_forward": "aten::nll_loss",
        "aten::embedding_dense_backward": "aten::embedding",
    }
    for traced, sampled in pairs.items():
        assert op_kind(traced) == op_kind(sampled) is not None, traced
    assert op_kind("aten::_log_softmax") != op_kind("aten::softmax")
    assert len({op_kind(op) for op in cases.SDPA_BACKENDS}) == 4


def test_variant_dimensions_are_checked_and_left_out_at_their_default() -> None:
    from tracecal.errors import SampleError
    from tracecal.samplers.grid import GridPoint

    plain = GridPoint("elementwise", "aten::copy_", "fwd", "float32", (("tokens", 4), ("hidden", 8)))
    assert "src" not in cases.resolved_dims(plain) and "src_dtype" not in cases.resolved_dims(plain)
    bad = GridPoint("elementwise", "aten::copy_", "fwd", "float32", (("tokens", 4), ("hidden", 8), ("src", "disk")))
    with pytest.raises(SampleError, match="src must be one of device, pinned, pageable"):
        cases.resolved_dims(bad)
    cast = GridPoint("elementwise", "aten::copy_", "fwd", "bfloat16",
                     (("tokens", 4), ("hidden", 8), ("src_dtype", "float32")))  # fmt: skip
    dims, types, _ = cases.trace_record(cast)
    assert types[:2] == ["c10::BFloat16", "float"] and orjson.dumps(dims)


def test_imported_samples_take_the_shape_columns_this_decoder_gives_their_trace_record(tmp_path: Path) -> None:
    """The shared samples were exported before copy_ counted each tensor at its own dtype: importing
    them re-derives their shape columns from the trace record in params_json; ids stay."""
    shared = H200 / "samples" / "h200_samples.parquet"
    db = tmp_path / "import.duckdb"
    result = CliRunner().invoke(
        app, ["samples", "import", str(shared), "--cluster", "h200", "--format", "parquet", "--db", str(db)]
    )
    assert result.exit_code == 0, result.output
    before = pl.read_parquet(shared).sort("sample_id")
    with open_database(db, read_only=True) as c:
        after = read_samples(c, "h200").sort("sample_id")
    assert after["sample_id"].to_list() == before["sample_id"].to_list()
    copies = after.filter(pl.col("op") == "aten::copy_")
    size = copies["dtype"].replace_strict({"bfloat16": 2, "float32": 4})
    assert copies.height and (copies["io_bytes"] == 2 * copies["elements"] * size).all()  # read + written
    others = [c.name for c in SHAPE_COLUMNS]
    assert (
        after.filter(pl.col("op") != "aten::copy_")
        .select(others)
        .equals(before.filter(pl.col("op") != "aten::copy_").select(others))
    )


class _PerParameter:
    """A whole-step optimizer model: ``NS_PER_PARAM`` per parameter of a step, nothing else covered."""

    NS_PER_PARAM = 0.1

    def __init__(self) -> None:
        self.rows: list[pl.DataFrame] = []

    def predict(self, frame: pl.DataFrame) -> np.ndarray:
        self.rows.append(frame)
        step = (frame["cpu_op_name"] == "Optimizer.step#AdamW.step").to_numpy()
        return np.where(step, frame["params"].cast(pl.Float64).fill_null(np.nan).to_numpy() * self.NS_PER_PARAM, np.nan)


def test_the_predicted_replay_models_an_optimizer_step_whole(h200_db: Path) -> None:
    """As the in-trace check does: the step's kernels are handed to the model as one call of the
    step over the rank's parameters, and share its prediction in proportion to their durations."""
    from tracecal.predict import durations
    from tracecal.predict.graph import build_graph
    from tracecal.predict.store import load_iteration

    with open_database(h200_db, read_only=True) as c:
        stored = load_iteration(c, "gpt_h2048_l8_bf16")
    graph = build_graph(stored.inputs)
    model = _PerParameter()
    predicted = durations.predicted(graph, model)
    rows = model.rows[0]
    step = rows.filter(pl.col("cpu_op_name") == "Optimizer.step#AdamW.step")
    assert step.height > 100 and step["cpu_op_event_id"].n_unique() == 1  # every kernel of the one step
    assert set(step["params"].to_list()) == {536039424} and set(step["batch"].to_list()) == {101}
    assert set(step["family"].to_list()) == {"optimizer"}
    idx, _ = durations.model_rows(graph)
    in_step = np.isin(graph.nodes["event_id"].to_numpy()[idx], step["event_id"].to_numpy())
    assert (predicted.source[idx][in_step] == "model").all()
    whole = 536039424 * _PerParameter.NS_PER_PARAM
    assert abs(predicted.dur_ns[idx][in_step].sum() - whole) <= in_step.sum()  # rounding per kernel
    # the coverage and a fallback see each kernel's own family, whatever the step's model did
    families = graph.nodes["family"].to_numpy()[idx][in_step]
    assert set(families.tolist()) >= {"optimizer"}


def test_a_cpu_only_step_keeps_its_operators() -> None:
    """On a CPU-only trace a step's leaf operators leave the Python time between them as gaps, which
    a CPU step sample includes: they stay operators of their own; the step's GPU kernels do not."""
    from tracecal.calibrate.in_trace import as_optimizer_steps

    rows = pl.DataFrame(
        {
            "kind": ["cpu_op", "kernel", "cpu_op"],
            "cpu_op_event_id": [1, 2, 3],
            "cpu_op_name": ["aten::sqrt", "aten::_foreach_sqrt", "aten::mm"],
            "family": ["elementwise", "optimizer", "gemm"],
            "optimizer_step_id": [9, 9, None],
            "optimizer_step": ["Optimizer.step#AdamW.step", "Optimizer.step#AdamW.step", None],
            "step_params": [1000, 1000, None],
            "step_tensors": [3, 3, None],
            "step_dtype": ["float32", "float32", None],
        }
    )
    out = as_optimizer_steps(rows)
    assert out["cpu_op_name"].to_list() == ["aten::sqrt", "Optimizer.step#AdamW.step", "aten::mm"]
    assert out["cpu_op_event_id"].to_list() == [1, 9, 3] and out["params"].to_list() == [None, 1000, None]

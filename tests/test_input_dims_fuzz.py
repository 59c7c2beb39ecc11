"""``Input Dims`` cells of any form (docs/parsing.md#input-dims): nested lists, empty lists, scalars, text and
truncated JSON reach the shape features, the collective sizes, the decoded kernel tables and a whole
Kineto ingest without raising anything but a ``TracecalError`` that names the file, line and column."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import GPUMODELING25
from tracecal.decode.shape_features import family_shape_table, shape_row
from tracecal.errors import TraceFormatError
from tracecal.ingest.input_dims import INT64_MAX, message_elements, tensor_shapes
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sources.gpumodeling25.read.decoded_run import TABLE_COLUMNS, read_kernel_table
from tracecal.sources.gpumodeling25.rebuild.reconstruct import RunShape
from tracecal.sources.gpumodeling25.rebuild.reconstruct import _kernel_rows as kernel_rows
from tracecal.sql.connection import open_database

LLEMMA_FWD = GPUMODELING25 / "runs" / "perlmutter" / "llemma_7B_4_2_2_4_4" / "31664313" / "0" / "fwd.csv"

OPS = (
    "c10d::allreduce_",
    "c10d::allgather_into_tensor_coalesced_",
    "c10d::_allgather_base_",
    "c10d::alltoall_base_",
    "nccl:all_reduce",
    "record_param_comms",
    "aten::cat",
    "aten::stack",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::add",
    "aten::_softmax",
    "aten::layer_norm",
    "aten::embedding",
    "aten::_fused_adamw_",
    "FlashAttnFunc",
    "aten::_scaled_dot_product_flash_attention",
)

_leaves = (
    st.integers(min_value=-3, max_value=2**70)
    | st.integers(min_value=0, max_value=4096)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
_values = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=4), max_leaves=16)
_tensor_lists = st.lists(
    st.lists(st.lists(st.integers(min_value=0, max_value=9000), min_size=1, max_size=4), max_size=3) | st.just([]),
    min_size=1,
    max_size=5,
)
"""Cells as newer torch writes them: each argument a tensor list (possibly empty)."""


@st.composite
def cells(draw: st.DrawFn) -> str:
    """An Input Dims cell as text: any JSON value, a tensor-list cell, or either cut short."""
    text = json.dumps(draw(_values | _tensor_lists))
    if draw(st.booleans()):
        text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
    return text


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(OPS), cell=cells(), types=st.sampled_from([None, '["c10::Half","c10::Half"]', "[1]", "x"]))
def test_shape_features_and_message_sizes_never_raise(op: str, cell: str, types: str | None) -> None:
    row = shape_row(op, cell, types)
    assert row["elements"] is None or row["elements"] >= 0
    size = message_elements(op, cell)
    assert size is None or 0 <= size <= INT64_MAX
    assert all(s and all(type(d) is int and d >= 0 for d in s) for s in tensor_shapes(cell))
    frame = pl.DataFrame(
        {"cpu_op_name": [op], "name": ["k"], "kind": ["kernel"], "input_dims": [cell]},
        schema_overrides={"input_dims": pl.String},
    ).with_columns(pl.lit(types, pl.String).alias("input_types"), pl.lit(None, pl.String).alias("cpu_concrete_inputs"))
    assert family_shape_table(frame).height == 1


def test_tensor_lists_follow_the_collective_signature() -> None:
    """An all-reduce's message is its tensor list; an all-gather's is its input, not its output list;
    a cat's elements are every tensor of its list."""
    assert message_elements("c10d::allreduce_", "[[[4, 2048, 6144]], [], [], []]") == 4 * 2048 * 6144
    assert message_elements("c10d::allgather_into_tensor_coalesced_", "[[[64, 8]], [[8, 8]], []]") == 64
    assert message_elements("c10d::_allgather_base_", "[[1073741824], [16777216], []]") == 16777216
    assert message_elements("nccl:all_reduce", "[[1248067584]]") == 1248067584
    assert message_elements("c10d::allreduce_", "[[], [], []]") is None  # older torch: the list unrecorded
    cat = shape_row("aten::cat", "[[[2048, 4, 16, 24], [2048, 4, 16, 72]], []]", '["TensorList", "Scalar"]')
    assert cat["elements"] == 2048 * 4 * 16 * (24 + 72)


@pytest.fixture(scope="module")
def real_rows() -> list[list[str]]:
    with LLEMMA_FWD.open(newline="") as handle:
        return list(csv.reader(handle))[1:40]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cell=cells(), row=st.integers(min_value=0, max_value=38), column=st.sampled_from([2, 5]))
def test_a_kernel_table_cell_is_read_or_named(
    real_rows: list[list[str]], tmp_path_factory: pytest.TempPathFactory, cell: str, row: int, column: int
) -> None:
    """A real kernel table with one Input Dims cell replaced: read and turned into the rebuild's rows, or
    refused naming the file, the line and the column."""
    rows = [list(r) for r in real_rows]
    rows[row][column] = cell
    path = tmp_path_factory.mktemp("table") / "fwd.csv"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([TABLE_COLUMNS, *rows])
    try:
        table = read_kernel_table(path)
    except TraceFormatError as exc:
        assert str(path) in str(exc) and f"line {row + 2}" in str(exc) and TABLE_COLUMNS[column] in str(exc)
        assert "\n" not in str(exc)
        return
    # the rows a rebuild starts from (where a tensor-list cell used to raise a TypeError)
    rows = kernel_rows(table, 1.0, RunShape(2, 1, 1, 1, 1, [1, 1], "fp16"))
    assert rows.height == table.height


def _trace(dims: object) -> dict[str, object]:
    """One step of a rank: a cat and an all-reduce (record_param_comms, its nccl: annotation and
    kernel), every Input Dims set to ``dims``."""
    cpu = {"pid": 1, "tid": 1}
    gpu = {"pid": 0, "tid": 7}
    return {
        "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"},
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, **cpu},
            {"ph": "X", "cat": "cpu_op", "name": "aten::cat", "ts": 1, "dur": 5, **cpu,
             "args": {"External id": 1, "Input Dims": dims, "Input type": ["TensorList", "Scalar"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 2, "dur": 1, **cpu,
             "args": {"correlation": 11, "External id": 1}},
            {"ph": "X", "cat": "kernel", "name": "CatArrayBatchedCopy", "ts": 10, "dur": 3, **gpu,
             "args": {"correlation": 11, "External id": 1, "device": 0, "stream": 7}},
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 20, "dur": 10, **cpu,
             "args": {"External id": 2, "Input Dims": dims, "Collective name": "allreduce",
                      "dtype": "Float", "Group size": 1}},
            {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "ts": 21, "dur": 8, **cpu,
             "args": {"External id": 3, "Input Dims": dims}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 22, "dur": 1, **cpu,
             "args": {"correlation": 12, "External id": 3}},
            {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "ts": 30, "dur": 20,
             **gpu, "args": {"correlation": 12, "External id": 3, "device": 0, "stream": 7}},
        ],
    }  # fmt: skip


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dims=_values | _tensor_lists | st.text(max_size=12))
def test_a_kineto_trace_with_any_input_dims_ingests(tmp_path_factory: pytest.TempPathFactory, dims: object) -> None:
    """Input Dims are arguments, not structure: whatever they hold, the trace ingests and decodes."""
    run = tmp_path_factory.mktemp("fuzz") / "run"
    run.mkdir()
    (run / "rank0.json").write_text(json.dumps(_trace(dims)))
    db = run.parent / "db.duckdb"
    with open_database(db) as con:
        ingest_runs(con, [run], IngestOptions(workers=1))
    with open_database(Path(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM collectives").fetchone() == (1,)
        assert con.execute("SELECT count(*) FROM operators WHERE kind = 'kernel'").fetchone() == (2,)


def test_a_kineto_all_reduce_sized_from_its_tensor_list(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    trace = _trace([[[4, 2048, 6144]], [], [], []])
    for event in trace["traceEvents"]:  # type: ignore[union-attr]
        if event["name"] == "nccl:all_reduce":
            event["args"]["Input Dims"] = [[[4, 2048, 6144]]]
    (run / "rank0.json").write_text(json.dumps(trace))
    with open_database(tmp_path / "db.duckdb") as con:
        ingest_runs(con, [run], IngestOptions(workers=1))
        assert con.execute("SELECT size_bytes FROM collectives").fetchone() == (4 * 2048 * 6144 * 4,)

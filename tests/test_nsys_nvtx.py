"""NVTX range texts -> kinds and operator fields: examples and a round-trip property over torch's
``getNvtxStr`` format."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tracecal.sources.nsys.nvtx import classify_nvtx


def classify(*texts: str | None) -> list[dict]:
    return classify_nvtx(pa.array(list(texts), pa.string())).to_pylist()


def test_examples() -> None:
    rows = classify(
        "aten::mm, seq = 12, op_id = 40, sizes = [[8, 512], [512, 1024]], input_op_ids = [(39, 0)]",
        "aten::detach_, seq = -1, op_id = 3",
        "MulBackward0, seq = 7, op_id = 9",
        "ProfilerStep#3, op_id = 4",
        "FSDP::pre_forward (blocks.9._checkpoint_wrapped_module), op_id = 993558",
        "ncclAllReduce",
        "ncclGroupEnd",
        "forward, microbatch 3",
        None,
    )
    assert [(r["kind"], r["name"]) for r in rows] == [
        ("cpu_op", "aten::mm"),
        ("cpu_op", "aten::detach_"),
        ("cpu_op", "MulBackward0"),
        ("user_annotation", "ProfilerStep#3"),
        ("user_annotation", "FSDP::pre_forward (blocks.9._checkpoint_wrapped_module)"),
        ("user_annotation", "ncclAllReduce"),
        ("user_annotation", "ncclGroupEnd"),
        ("user_annotation", "forward, microbatch 3"),
        ("user_annotation", None),
    ]
    assert rows[0]["sequence_number"] == 12 and rows[0]["input_dims"] == "[[8,512],[512,1024]]"
    assert rows[1]["sequence_number"] is None  # -1: outside autograd
    assert [r["coll_name"] for r in rows[5:7]] == ["allreduce", None]


def test_empty_input() -> None:
    assert classify_nvtx(pa.array([], pa.string())).num_rows == 0


op_names = st.from_regex(r"\A(aten|c10d|flash_attn)::[a-z_][a-z0-9_]{0,20}\Z")
shapes = st.lists(st.lists(st.integers(0, 1 << 40), max_size=4), max_size=5)


@settings(max_examples=200, deadline=None)
@given(name=op_names, seq=st.none() | st.integers(0, 1 << 40), op_id=st.integers(1, 1 << 40), sizes=shapes | st.none())
def test_emit_nvtx_round_trip(name: str, seq: int | None, op_id: int, sizes: list[list[int]] | None) -> None:
    """Whatever torch writes, the name, sequence number and shapes come back exactly."""
    text = name if seq is None else f"{name}, seq = {seq}"
    text += f", op_id = {op_id}"
    if sizes is not None:
        text += ", sizes = [" + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in sizes) + "]"
    (row,) = classify(text)
    assert (row["kind"], row["name"], row["sequence_number"]) == ("cpu_op", name, seq)
    if sizes is None:
        assert row["input_dims"] is None
    else:
        assert json.loads(row["input_dims"]) == sizes
        assert " " not in row["input_dims"]

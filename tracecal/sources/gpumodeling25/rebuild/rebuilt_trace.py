"""The rank trace of a rebuilt iteration: its CPU program and GPU activity as Kineto-style events.

``reconstruct`` decides what every rank runs and when its GPU runs it; this module
writes it down as the events a ``with_stack`` torch-profiler trace of DeepSpeed holds, so the same
decode reads it: the DeepSpeed frames that name the measured modules, the CPU operators with their
``Input Dims`` (types from the run's precision), one launch per GPU activity (correlation and External
id), and the collective arguments newer Kineto puts on NCCL kernels. The CPU program is compact and
runs ahead of the GPU, except before a kernel the GPU idles for: there it synchronizes with the work
before the gap and launches the kernel late (``rank_events``), so the replay's dependencies explain
the gap.
"""

from __future__ import annotations

import json
import re

import numpy as np
import polars as pl
import pyarrow as pa

from tracecal.schema import EVENTS, arrow_schema

SCOPE = {
    "train_batch": "deepspeed/runtime/pipe/engine.py: train_batch",
    "forward": "deepspeed/runtime/pipe/engine.py: _exec_forward_pass",
    "stage_forward": "deepspeed/runtime/pipe/module.py: forward",
    "backward": "deepspeed/runtime/pipe/engine.py: _exec_backward_pass",
    "layer_forward": "deepspeed/runtime/activation_checkpointing/checkpointing.py: forward",
    "layer_backward": "CheckpointFunctionBackward",
    "send_activation": "deepspeed/runtime/pipe/engine.py: _exec_send_activations",
    "recv_activation": "deepspeed/runtime/pipe/engine.py: _exec_recv_activations",
    "send_grad": "deepspeed/runtime/pipe/engine.py: _exec_send_grads",
    "recv_grad": "deepspeed/runtime/pipe/engine.py: _exec_recv_grads",
    "reduce_grads": "deepspeed/runtime/pipe/engine.py: _exec_reduce_grads",
    "optimizer_step": "deepspeed/runtime/pipe/engine.py: _exec_optimizer_step",
    "aggregate_loss": "deepspeed/runtime/pipe/engine.py: _aggregate_total_loss",
    "all_gather": "deepspeed/runtime/utils.py: all_gather_all_partitions",
    "tp_reduce": "_ReduceFromModelParallelRegion",
}
"""The DeepSpeed/GPT-NeoX frames the rebuilt CPU program nests its operators in (as a ``with_stack``
trace names them, without line numbers)."""

PRECISION_TYPES = {"fp16": ("c10::Half", "Half"), "bf16": ("c10::BFloat16", "BFloat16"), "fp32": ("float", "Float")}
"""A run's precision -> the ``Input type`` of its tensors and the NCCL element type of its buffers."""

GROUPS = ("tp", "dp", "pp", "mp")
"""Process-group kinds of a rebuilt rank: tensor-, data-, pipeline- and model-parallel (pipe x model)."""


def parse_dims(dims: str | None) -> list | None:
    """``Input Dims`` text as a list, or None when absent or not JSON."""
    if not dims:
        return None
    try:
        parsed = json.loads(dims)
    except ValueError:
        return None
    return parsed if isinstance(parsed, list) else None


def types_for(dims: str | None, aten_type: str) -> str | None:
    """Input types of an operator whose tables lost them: the run's precision for every tensor."""
    parsed = parse_dims(dims)
    if parsed is None:
        return None
    return json.dumps([aten_type if isinstance(d, list) and d else "Scalar" for d in parsed])


_PY_FRAME = re.compile(r"\.py(\(\d+\))?: |^<built-in method ")
"""Names of Python frames (``with_stack``), stored as ``python_function`` events."""

_RUNTIME_CALL = {"kernel": "cudaLaunchKernel", "memcpy": "cudaMemcpyAsync", "memset": "cudaMemsetAsync"}
_GPU_CATEGORY = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
_KINETO_COLL = {"allreduce": "allreduce", "allgather": "_allgather_base", "reducescatter": "_reduce_scatter_base"}
_OPEN_NS, _CLOSE_NS, _CALL_NS, _CALL_STEP_NS = 20, 20, 100, 120
"""CPU program timing: every operator and call is short, so the program runs ahead of the GPU."""
_BASE_NS = 1_000_000_000
"""The rebuilt iteration's CPU program starts at this time on every rank's (common) clock."""
_GPU_LEAD_NS = 100_000
"""The GPU timeline starts this long after the CPU program (the first launches' head start)."""
LAUNCH_NS, SYNC_RETURN_NS = 4_000, 1_000
"""Launch latency (call start to kernel start on an idle stream) and a synchronize's return latency."""
SYNC_MIN_GAP_NS = LAUNCH_NS + SYNC_RETURN_NS + 1_000
"""A GPU gap at least this long before a kernel is the CPU's: it waited for the work before the gap
(a synchronize), then spent the rest launching; a shorter gap is left to the stream (slack)."""


class _Events:
    """Column lists of one rank's events, appended in program order."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {c: [] for c in EVENTS.column_names}

    def add(self, **values: object) -> int:
        event_id = len(self.cols["event_id"])
        values["event_id"] = event_id
        for name, column in self.cols.items():
            column.append(values.get(name))
        return event_id

    def set(self, event_id: int, **values: object) -> None:
        for name, value in values.items():
            self.cols[name][event_id] = value

    def table(self) -> pa.Table:
        return pa.Table.from_pydict(self.cols, schema=arrow_schema(EVENTS))


def _chain(row: dict, aten_type: str) -> list[tuple[tuple, str, str, str | None, str | None]]:
    """The CPU frames a row's launch is nested in, outermost first: (identity, name, kind, dims, types)."""
    ins, layer = row["instruction"], row["layer"]
    chain: list[tuple[tuple, str, str, str | None, str | None]] = [
        (("train_batch",), SCOPE["train_batch"], "python_function", None, None),
        (("ins", ins), SCOPE[row["scope"]], "python_function", None, None),
    ]
    if row["scope"] == "forward":
        chain.append((("stage", ins), SCOPE["stage_forward"], "python_function", None, None))
    if layer is not None:
        forward = row["scope"] == "forward"
        name = SCOPE["layer_forward"] if forward else SCOPE["layer_backward"]
        chain.append((("layer", ins, layer), name, "python_function" if forward else "cpu_op", None, None))
    outer, inner = row["outer_op"], row["inner_op"]
    if layer is not None:  # the table's own record of the layer frame is the frame opened above
        outer = None if outer is not None and outer.endswith(chain[-1][1]) else outer
        inner = None if inner is not None and inner.endswith(chain[-1][1]) else inner
    if outer is not None and outer != inner:
        kind = "python_function" if _PY_FRAME.search(outer) else "cpu_op"
        chain.append((("outer", ins, layer, row["outer_id"], outer), outer, kind, row["outer_dims"], None))
    if row["extra_scope"] is not None and row["extra_scope"] != outer:
        chain.append((("extra", ins, layer, row["_run"]), row["extra_scope"], "cpu_op", None, None))
    if inner is not None:
        types = types_for(row["inner_dims"], aten_type)
        chain.append((("inner", ins, layer, row["inner_id"], inner), inner, "cpu_op", row["inner_dims"], types))
    return chain


def _launch_time(cursor: int, before_end: int | None, kernel_start: int) -> int | None:
    """When the CPU launches a kernel that starts at ``kernel_start`` after work ending at
    ``before_end`` (None: the rank's first): at ``cursor`` when the CPU is ahead and the GPU does
    not idle long before the kernel; None when the CPU must first synchronize (the GPU idles at least
    ``SYNC_MIN_GAP_NS`` while the CPU, ahead, had nothing left to launch); else (the CPU is already
    late) when it gets there, at the latest the launch latency before the kernel starts."""
    if before_end is None or kernel_start - before_end < SYNC_MIN_GAP_NS:
        return min(cursor, kernel_start)
    if cursor < before_end:
        return None
    return min(max(cursor, kernel_start - LAUNCH_NS), kernel_start)


def rank_events(
    plan: pl.DataFrame, start: np.ndarray, end: np.ndarray, *, rank: int, groups: dict[str, list[int]], aten_type: str
) -> pa.Table:
    """The events of one rebuilt rank: its CPU program (scopes, operators, launches) and GPU activity.

    The CPU program runs ahead of the GPU, except where the GPU idles before a kernel for at least
    ``SYNC_MIN_GAP_NS``: there the CPU was late, so it synchronizes with the GPU (a
    ``cudaDeviceSynchronize`` that returns ``SYNC_RETURN_NS`` after the work before the gap ends, as
    DeepSpeed's per-layer, timer and ``.item()`` synchronizations do) and launches the kernel
    ``LAUNCH_NS`` before it starts. The replay's dependencies then explain every such gap, and a
    gap follows the work before it when durations change.

    Args:
        plan: the rank's rows in stream order (``reconstruct.ROW_SCHEMA``).
        start, end: each row's GPU start and end, ns from the iteration start (``reconstruct.layout``).
        rank: the rank's global rank.
        groups: the global ranks of its process groups by kind (tp, dp, pp, mp).
        aten_type: the ``Input type`` of its operators' tensors (the run's precision).
    """
    pid, tid, stream = 100_000 + rank, 1, 7
    ev = _Events()
    marker = ev.add(
        kind="user_annotation", category="user_annotation", name="ProfilerStep#1", ts_ns=_BASE_NS, pid=pid, tid=tid
    )
    plan = plan.with_columns(
        (
            pl.col("extra_scope").ne_missing(pl.col("extra_scope").shift(1))
            | pl.col("instruction").ne_missing(pl.col("instruction").shift(1))
        )
        .cum_sum()
        .alias("_run")
    )
    cursor = _BASE_NS + _OPEN_NS
    gpu_base = _BASE_NS + _GPU_LEAD_NS
    gpu_start, gpu_end = gpu_base + start.astype(np.int64), gpu_base + end.astype(np.int64)
    stack: list[tuple[tuple, int]] = []  # (identity, event id) of the open frames
    next_external = 1
    launches: list[tuple[int, int, int]] = []  # per row: runtime correlation, external id, runtime event
    for i, row in enumerate(plan.iter_rows(named=True)):
        chain = _chain(row, aten_type)
        keep = 0
        while keep < min(len(stack), len(chain)) and stack[keep][0] == chain[keep][0]:
            keep += 1
        for _, event_id in reversed(stack[keep:]):
            ev.set(event_id, dur_ns=cursor - ev.cols["ts_ns"][event_id])
            cursor += _CLOSE_NS
        stack = stack[:keep]
        for identity, name, kind, dims, types in chain[keep:]:
            event_id = ev.add(
                kind=kind, category=kind, name=name, ts_ns=cursor, pid=pid, tid=tid,
                external_id=next_external, input_dims=dims, input_types=types,
            )  # fmt: skip
            next_external += 1
            stack.append((identity, event_id))
            cursor += _OPEN_NS
        op_external = ev.cols["external_id"][stack[-1][1]] if row["inner_op"] is not None else None
        driver = row["inner_op"] is None and row["kind"] == "kernel"
        call = "cuLaunchKernel" if driver else _RUNTIME_CALL[row["kind"]]
        correlation = len(launches) + 1
        kind = "cuda_driver" if driver else "cuda_runtime"
        launch_at = _launch_time(cursor, gpu_end[i - 1] if i else None, int(gpu_start[i]))
        if launch_at is None:  # the CPU waits for the work before the gap, then launches
            ret = int(gpu_end[i - 1]) + SYNC_RETURN_NS
            ev.add(
                kind="cuda_runtime", category="cuda_runtime", name="cudaDeviceSynchronize", ts_ns=cursor,
                dur_ns=ret - cursor, pid=pid, tid=tid,
            )  # fmt: skip
            launch_at = int(gpu_start[i]) - LAUNCH_NS
        runtime = ev.add(
            kind=kind, category=kind, name=call, ts_ns=launch_at, dur_ns=_CALL_NS, pid=pid, tid=tid,
            correlation=correlation, external_id=op_external,
        )  # fmt: skip
        launches.append((correlation, op_external or 0, runtime))
        cursor = launch_at + _CALL_STEP_NS
    for _, event_id in reversed(stack):
        ev.set(event_id, dur_ns=cursor - ev.cols["ts_ns"][event_id])
        cursor += _CLOSE_NS
    ev.set(marker, dur_ns=cursor - _BASE_NS)
    ranks_json = {kind: json.dumps(members) for kind, members in groups.items()}
    for (correlation, external, _), row, s, e in zip(launches, plan.iter_rows(named=True), start, end, strict=True):
        coll = row["coll"]
        coll_args: dict[str, object] = {}
        if coll is not None:
            group = row["group"] or "tp"
            size = len(groups[group])
            nelems = row["nelems"]
            coll_args = {
                "coll_name": _KINETO_COLL.get(coll, coll),
                "in_msg_nelems": nelems,
                "out_msg_nelems": nelems * size if coll == "allgather" and nelems is not None else nelems,
                "group_size": 2 if coll in ("send", "recv") else size,
                "coll_dtype": row["coll_dtype"],
                "pg_name": f"{group}-{groups[group][0]}",  # unique per process group
                "pg_ranks": ranks_json[group],
                "dst_rank": row["peer"] if coll == "send" else None,
                "src_rank": row["peer"] if coll == "recv" else None,
            }
        ev.add(
            kind=row["kind"], category=_GPU_CATEGORY[row["kind"]], name=row["kernel"], ts_ns=gpu_base + int(s),
            dur_ns=int(e - s), pid=0, tid=stream, device=0, stream=stream, correlation=correlation,
            external_id=external or None, **coll_args,
        )  # fmt: skip
    return ev.table()

"""``--from-run``: sample exactly the compute operator calls of an ingested run.

``run_points(con, run_id, dtypes=None)`` reads the distinct (family, CPU op, Input Dims, Input type,
phase, causal) of the run's ``operators`` (query ``sql/queries/run_op_shapes.sql``) and maps each to a
grid point of the compute sampler:

- the traced call itself, as a ``fwd`` point (a sample is one call of the op, whatever phase it ran
  in — an ``aten::mm`` inside ``MmBackward0`` is an mm of its own shape);
- for calls traced in the forward phase of a run that has a backward phase, also the ``bwd`` point
  (the autograd backward of that call, the sampler's ``bwd`` convention, see ``cases``).

Mapping is by the CPU operator name (``map_call``): gemm (mm, addmm, bmm, baddbmm, linear, matmul),
SDPA and its flash/efficient/cudnn variants, softmax, layer/RMS norm, gelu/silu/add/mul without
broadcasting, the optimizer's and the gradient bookkeeping's single-tensor ops (``cases.INPLACE_OPS``:
copy_, fill_, zero_, sqrt, lerp_, addcdiv_, addcmul_ on same-shape operands), embedding,
cross-entropy, and fused Adam/AdamW over TensorLists. Everything else —
backward aten ops (sampled through their forward op's ``bwd``), other dtypes, broadcasting
elementwise calls, unknown causality — is reported per op with the reason, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson

from tracecal.decode.shapes import normalize_dtype
from tracecal.errors import RunNotFoundError, SampleError
from tracecal.samplers.cases import DTYPE_NAMES, INPLACE_OPS, OP_SPECS
from tracecal.samplers.grid import GridPoint
from tracecal.sql.connection import query_arrow

QUERY = Path(__file__).resolve().parents[1] / "sql" / "queries" / "run_op_shapes.sql"

_SDPA = {
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
}
_FLASH = "aten::_flash_attention_forward"


@dataclass
class RunPlan:
    """Points to sample for a run, and what could not be mapped."""

    run_id: str
    points: list[GridPoint] = field(default_factory=list)
    traced: dict[GridPoint, dict[str, Any]] = field(default_factory=dict)
    """Per point: the traced op, phases and operator count it stands for (goes to params_json)."""
    unmapped: dict[tuple[str, str], int] = field(default_factory=dict)
    """(cpu op, reason) -> distinct call signatures not sampled."""
    training: bool = False
    """The run has a backward phase: its forward calls recorded autograd graphs (sample them so)."""

    def params_for(self, point: GridPoint) -> dict[str, Any]:
        return {"from_run": self.run_id, **self.traced.get(point, {})}


def _shapes(dims: list[Any]) -> list[list[int]]:
    """Tensor argument shapes (non-empty int lists) in argument order."""
    return [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]


def _point(family: str, op: str, dtype: str, **dims: Any) -> GridPoint:
    return GridPoint(family, op, "fwd", dtype, tuple(dims.items()))


def map_call(
    name: str, dims: list[Any], types: list[Any], causal: bool | None, list_dtype: str | None = None
) -> GridPoint | str:
    """The fwd grid point that re-runs one traced call, or the reason it cannot be sampled.

    ``list_dtype`` is the element type to assume for TensorList arguments (fused optimizers), which
    traces record only as ``TensorList``; without it such calls are not sampled.
    """
    if "backward" in name.lower():
        return "backward op: sampled as the bwd of its forward op"
    tensor_types = [t for d, t in zip(dims, types, strict=False) if isinstance(d, list) and d]
    dtype = normalize_dtype(tensor_types[0]) if tensor_types and isinstance(tensor_types[0], str) else None
    shapes = _shapes(dims)
    op = name.split("::")[-1]
    if op in ("_fused_adam_", "_fused_adamw_", "_fused_adam", "_fused_adamw"):
        params = dims[0] if dims and isinstance(dims[0], list) else []
        sizes = [math.prod(s) for s in params if isinstance(s, list) and s]
        if not sizes:
            return "no parameter TensorList in Input Dims"
        param_dtype = dtype or list_dtype
        if param_dtype is None:
            return "parameter dtype not in the trace (TensorList); pass --dtype to sample it"
        which = "AdamW" if "adamw" in op else "Adam"
        return _point("optimizer", f"Optimizer.step#{which}.step", param_dtype, params=sum(sizes), tensors=len(sizes))
    if dtype not in DTYPE_NAMES:
        return f"dtype {dtype or 'unknown'} is not sampled (only {', '.join(DTYPE_NAMES)})"
    if op == "mm" and len(shapes) >= 2 and len(shapes[0]) == len(shapes[1]) == 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        return _point("gemm", "aten::mm", dtype, m=m, n=n, k=k)
    if op == "addmm" and len(shapes) >= 3 and len(shapes[1]) == len(shapes[2]) == 2:
        (m, k), (_, n) = shapes[1], shapes[2]
        return _point("gemm", "aten::addmm", dtype, m=m, n=n, k=k)
    if op in ("bmm", "baddbmm"):
        pair = shapes[0:2] if op == "bmm" else shapes[1:3]
        if len(pair) == 2 and len(pair[0]) == len(pair[1]) == 3 and pair[0][0] == pair[1][0]:
            a, b = pair
            return _point("gemm", f"aten::{op}", dtype, batch=a[0], m=a[1], n=b[2], k=a[2])
        return f"{op} operands are not [b,m,k] x [b,k,n]"
    if op == "linear" and len(shapes) >= 2 and len(shapes[1]) == 2:
        return _point("gemm", "aten::linear", dtype, m=math.prod(shapes[0][:-1]), n=shapes[1][0], k=shapes[1][1])
    if op == "matmul" and len(shapes) >= 2:
        a, b = shapes[0], shapes[1]
        if len(b) == 2 and len(a) >= 2:  # a 2-D right operand folds A's batch dimensions into M
            return _point("gemm", "aten::mm", dtype, m=math.prod(a[:-1]), n=b[1], k=b[0])
        if len(a) >= 3 and a[:-2] == b[:-2]:
            return _point("gemm", "aten::bmm", dtype, batch=math.prod(a[:-2]), m=a[-2], n=b[-1], k=a[-1])
        return "matmul operands broadcast; not sampled"
    if name in _SDPA or name == _FLASH:
        if len(shapes) < 2 or len(shapes[0]) != 4 or len(shapes[1]) != 4:
            return "attention inputs are not 4-D"
        if causal is None:
            return "causality unknown (no Concrete Inputs in the trace)"
        if name == _FLASH:  # flash-attention layout [batch, seq, heads, head_dim]
            (nb, sq, h, d), sk = shapes[0], shapes[1][1]
        else:  # SDPA layout [batch, heads, seq, head_dim]
            (nb, h, sq, d), sk = shapes[0], shapes[1][2]
        return _point(
            "attention", "aten::scaled_dot_product_attention", dtype,
            batch=nb, heads=h, seq_q=sq, seq_k=sk, head_dim=d, causal=causal,
        )  # fmt: skip
    if not shapes:
        return "no tensor inputs in Input Dims"
    x = shapes[0]
    rows = {"tokens": math.prod(x[:-1]) if len(x) > 1 else 1, "hidden": x[-1]}
    if op in ("softmax", "_softmax"):
        return _point("softmax", "aten::softmax", dtype, **rows)
    if op in ("layer_norm", "native_layer_norm"):
        return _point("norm", "aten::layer_norm", dtype, **rows)
    if op in ("rms_norm", "_fused_rms_norm"):
        return _point("norm", "aten::rms_norm", dtype, **rows)
    if op in ("gelu", "gelu_", "silu", "silu_"):
        return _point("elementwise", f"aten::{op.rstrip('_')}", dtype, **rows)
    if name in INPLACE_OPS:
        if any(s != x for s in shapes):
            return "broadcasting operands; not sampled"
        return _point("elementwise", name, dtype, **rows)
    if op in ("add", "add_", "mul", "mul_"):
        if len(shapes) < 2 or shapes[1] != x:
            return "broadcasting or scalar operand; not sampled"
        return _point("elementwise", f"aten::{op.rstrip('_')}", dtype, **rows)
    if op == "embedding" and len(shapes) >= 2 and len(shapes[0]) == 2:
        return _point(
            "embedding", "aten::embedding", dtype, tokens=math.prod(shapes[1]), vocab=shapes[0][0], hidden=shapes[0][1]
        )
    if op == "cross_entropy_loss" and len(x) == 2:
        return _point("loss", "aten::cross_entropy_loss", dtype, tokens=x[0], vocab=x[1])
    return "no sampler for this op"


def run_points(con: duckdb.DuckDBPyConnection, run_id: str, dtypes: list[str] | None = None) -> RunPlan:
    """The grid points that re-run the compute calls of ``run_id`` (see the module docstring).

    ``dtypes`` keeps only calls of those dtypes. Points come out in order of the traced time they
    stand for, largest first, without duplicates.

    Raises:
        RunNotFoundError: the run is not in the database.
        SampleError: the run has no compute operators to sample.
    """
    if con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchall() == [(0,)]:
        known = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        raise RunNotFoundError(
            f"run {run_id!r} is not in the database ({'runs: ' + ', '.join(known) if known else 'no runs'}); "
            "ingest it first with trace-ingest RUN_DIR"
        )
    rows = query_arrow(con, QUERY.read_text(), [run_id]).to_pylist()
    if not rows:
        raise SampleError(f"run {run_id!r} has no compute operators (gemm, attention, ...) to sample")
    has_bwd = any(r["phase"] == "bwd" for r in rows)
    plan = RunPlan(run_id, training=has_bwd)
    for r in rows:
        dims = orjson.loads(r["input_dims"]) if r["input_dims"] else []
        types = orjson.loads(r["input_types"]) if r["input_types"] else []
        mapped = map_call(r["cpu_op_name"], dims, types, r["causal"], dtypes[0] if dtypes else None)
        if isinstance(mapped, str):
            key = (r["cpu_op_name"], mapped)
            plan.unmapped[key] = plan.unmapped.get(key, 0) + 1
            continue
        if dtypes and mapped.dtype not in dtypes:
            continue
        directions = ["fwd"]
        if has_bwd and r["phase"] == "fwd" and OP_SPECS[(mapped.family, mapped.op)].has_backward:
            directions.append("bwd")
        for direction in directions:
            point = GridPoint(mapped.family, mapped.op, direction, mapped.dtype, mapped.dims)
            info = plan.traced.get(point)
            if info is None:
                plan.points.append(point)
                info = plan.traced[point] = {"traced_ops": [], "traced_phases": [], "traced_operators": 0}
            if r["cpu_op_name"] not in info["traced_ops"]:
                info["traced_ops"].append(r["cpu_op_name"])
            if r["phase"] not in info["traced_phases"]:
                info["traced_phases"].append(r["phase"])
            info["traced_operators"] += int(r["operators"])
    return plan

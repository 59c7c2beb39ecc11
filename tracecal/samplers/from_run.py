"""``--from-run``: sample the operator calls of an ingested run, and say how much of its time they cover.

``run_points(con, run_id, dtypes=None)`` reads the distinct calls of the run's best iteration
(query ``sql/queries/run_op_shapes.sql``: CPU op, Input Dims, Input type, Concrete Inputs, phase,
causality, the memcpy kind) and maps each to the grid point of the compute sampler that re-runs it
(``map_call``):

- a forward call is a ``fwd`` point of its own shape (an ``aten::mm`` inside ``MmBackward0`` is an mm
  of its own shape: GEMMs are always modelled per call);
- a backward op (``native_layer_norm_backward``, ``_cudnn_attention_backward``,
  ``embedding_dense_backward``, ...) is the ``bwd`` point of its forward op, with the forward call's
  shape (the sampler's ``bwd`` convention, see ``cases``);
- on a GPU trace, every call inside an ``Optimizer.step#<Class>.step`` annotation is part of one
  optimizer-step point over the rank's parameters (``parameter_groups``: the parameters the autograd
  engine accumulated gradients into), with the step's implementation (fused, foreach or a
  per-parameter loop); on a CPU-only trace the step's calls are points of their own, as the replay
  and the in-trace check score them (``calibrate.in_trace.STEP_KINDS``);
- memsets and memcpys belong to the call that issued them (a cuBLAS workspace memset is part of its
  mm; a same-dtype ``copy_`` is a device-to-device memcpy; a ``copy_`` from host memory is a
  host-to-device memcpy, pinned or pageable as traced).

The dtype of a point is the traced call's; a TensorList call (``cat``) takes the element size its
kernel moved. Calls no sampler re-runs are counted by (CPU op, reason), and ``RunPlan.coverage``
says how much of the iteration's GPU operator time the points stand for; ``uncovered`` lists the rest
by name. Nothing is guessed: a call whose shape, dtype or causality the trace does not say is
reported, not sampled.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import duckdb
import orjson

from tracecal.decode.parameters import StepParameters
from tracecal.decode.parameters import parameter_groups as decoded_parameter_groups
from tracecal.decode.shape_features import normalize_dtype, shape_row
from tracecal.errors import RunNotFoundError, SampleError
from tracecal.samplers.cases import DTYPE_BYTES, DTYPE_NAMES, INPLACE_OPS, OP_SPECS
from tracecal.samplers.grid import GridPoint
from tracecal.sql.query_files import query_file

_ATTENTION_OPS = {
    "scaled_dot_product_attention": "aten::scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention": "aten::_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu": "aten::_scaled_dot_product_flash_attention",
    "_flash_attention_forward": "aten::_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention": "aten::_scaled_dot_product_efficient_attention",
    "_efficient_attention_forward": "aten::_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention": "aten::_scaled_dot_product_cudnn_attention",
    "_cudnn_attention_forward": "aten::_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math": "aten::_scaled_dot_product_attention_math",
}
"""Traced attention ops (the SDPA entry, its backend ops and their kernels' aten ops) -> the sampler
op that runs the same backend. Their ``*_backward`` ops are the ``bwd`` points of the same op."""

_ROW_BACKWARD = {
    "native_layer_norm_backward": ("norm", "aten::layer_norm"),
    "gelu_backward": ("elementwise", "aten::gelu"),
    "silu_backward": ("elementwise", "aten::silu"),
    "_softmax_backward_data": ("softmax", "aten::softmax"),
    "_log_softmax_backward_data": ("softmax", "aten::log_softmax"),
}
"""Backward ops whose first tensor has the forward input's shape -> (family, forward sampler op)."""

_EMBEDDING_BACKWARD = ("embedding_dense_backward", "embedding_backward")
_NUM_WEIGHTS_ARG = 2
"""Position of ``num_weights`` (the vocabulary) in the embedding backward ops' Concrete Inputs."""

_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(\w+)\.step$")

_MEMCPY_SOURCE = (("HtoD", "Pinned", "pinned"), ("HtoD", "Pageable", "pageable"), ("DtoD", "", "device"))
"""(memcpy kind, source memory, ``src`` of the copy_ point) in the profiler's memcpy names."""


@dataclass
class RunPlan:
    """Points to sample for a run, what could not be mapped, and the time the points cover."""

    run_id: str
    points: list[GridPoint] = field(default_factory=list)
    traced: dict[GridPoint, dict[str, Any]] = field(default_factory=dict)
    """Per point: the traced op, phases, operator count and time it stands for (goes to params_json)."""
    unmapped: dict[tuple[str, str], int] = field(default_factory=dict)
    """(cpu op, reason) -> distinct call signatures not sampled."""
    training: bool = False
    """The run has a backward phase: its forward calls recorded autograd graphs (sample them so)."""
    covered_ns: int = 0
    """Time of the operators (best iteration, collectives left out) whose call a point re-runs."""
    total_ns: int = 0
    """Time of all those operators."""
    uncovered: dict[tuple[str, str], int] = field(default_factory=dict)
    """(operator name, reason) -> time (ns) no point covers."""
    gpu: bool = False
    """The operators are GPU activities (kernels, memcpys, memsets), not CPU operators."""

    def params_for(self, point: GridPoint) -> dict[str, Any]:
        info = self.traced.get(point, {})
        return {"from_run": self.run_id, **{k: v for k, v in info.items() if k != "traced_ns"}}

    @property
    def coverage(self) -> float | None:
        """Share (0–1) of the operator time the points cover; None for a run without operators."""
        return self.covered_ns / self.total_ns if self.total_ns else None


def _shapes(dims: list[Any]) -> list[list[int]]:
    """Tensor argument shapes (non-empty int lists) in argument order."""
    return [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]


def _point(family: str, op: str, dtype: str, direction: str = "fwd", **dims: Any) -> GridPoint:
    return GridPoint(family, op, direction, dtype, tuple((k, v) for k, v in dims.items() if v is not None))


def _dtype(types: list[Any], index: int) -> str | None:
    tensor_types = [t for t in types if isinstance(t, str) and t not in ("", "Scalar", "ScalarList", "TensorList")]
    return normalize_dtype(tensor_types[index]) if len(tensor_types) > index else None


def _rows(x: list[int]) -> dict[str, Any]:
    return {"tokens": math.prod(x[:-1]) if len(x) > 1 else 1, "hidden": x[-1]}


def _concrete(concrete: list[Any], pos: int) -> Any:
    if pos >= len(concrete) or concrete[pos] in ("", None):
        return None
    try:
        return orjson.loads(concrete[pos]) if isinstance(concrete[pos], str) else concrete[pos]
    except orjson.JSONDecodeError:
        return concrete[pos]


def map_call(
    name: str,
    dims: list[Any],
    types: list[Any],
    causal: bool | None,
    list_dtype: str | None = None,
    *,
    concrete: list[Any] | None = None,
    memcpy: str | None = None,
) -> GridPoint | str:
    """The grid point that re-runs one traced call (``fwd``, or ``bwd`` for a backward op), or the
    reason it cannot be sampled.

    ``list_dtype`` is the element type of TensorList arguments (fused optimizers, ``cat``), which
    traces record only as ``TensorList``; without it such calls are not sampled. ``concrete`` are the
    call's Concrete Inputs (reduced dims, an embedding's vocabulary), ``memcpy`` the name of the
    memcpy the call issued (host-to-device or device-to-device).
    """
    concrete = concrete or []
    op = name.split("::")[-1]
    base = op.removesuffix("_backward")
    base = base if base in _ATTENTION_OPS else f"{base}_forward"  # _cudnn_attention_backward
    shapes = _shapes(dims)
    if base in _ATTENTION_OPS:
        return _attention(name, op.endswith("_backward"), _ATTENTION_OPS[base], dims, types, causal, concrete)
    if op in ("_fused_adam_", "_fused_adamw_", "_fused_adam", "_fused_adamw"):
        params = dims[0] if dims and isinstance(dims[0], list) else []
        sizes = [math.prod(s) for s in params if isinstance(s, list) and s]
        if not sizes:
            return "no parameter TensorList in Input Dims"
        param_dtype = _dtype(types, 0) or list_dtype
        if param_dtype is None:
            return "parameter dtype not in the trace (TensorList); pass --dtype to sample it"
        which = "AdamW" if "adamw" in op else "Adam"
        return _point("optimizer", f"Optimizer.step#{which}.step", param_dtype, params=sum(sizes),
                      tensors=len(sizes), impl="fused")  # fmt: skip
    if op == "cat":
        return _cat(dims, list_dtype)
    if op in _EMBEDDING_BACKWARD:
        return _embedding_backward(dims, types, concrete)
    dtype = _dtype(types, 0)
    if dtype not in DTYPE_NAMES:
        return f"dtype {dtype or 'unknown'} is not sampled (only {', '.join(DTYPE_NAMES)})"
    if op in _ROW_BACKWARD:
        family, forward = _ROW_BACKWARD[op]
        if not shapes:
            return "no tensor inputs in Input Dims"
        return _point(family, forward, dtype, "bwd", **_rows(shapes[0]))
    if op == "nll_loss_backward":
        logits = [s for s in shapes if len(s) == 2]
        if not logits:
            return "nll_loss_backward input is not [tokens, classes]"
        return _point(
            "loss", "aten::nll_loss", _dtype(types, 1) or dtype, "bwd", tokens=logits[0][0], vocab=logits[0][1]
        )
    if "backward" in name.lower():
        return "backward op without a sampler of its forward op"
    gemm = _gemm(op, shapes, dtype)
    if gemm is not None:
        return gemm
    if not shapes:
        return "only scalar (0-d) tensors; not sampled" if dims else "no tensor inputs in Input Dims"
    x = shapes[0]
    rows = _rows(x)
    if op in ("softmax", "_softmax", "log_softmax", "_log_softmax"):
        return _point("softmax", f"aten::{op.lstrip('_')}", dtype, **rows)
    if op in ("layer_norm", "native_layer_norm"):
        return _point("norm", "aten::layer_norm", dtype, **rows)
    if op in ("rms_norm", "_fused_rms_norm"):
        return _point("norm", "aten::rms_norm", dtype, **rows)
    if op in ("gelu", "gelu_", "silu", "silu_"):
        return _point("elementwise", f"aten::{op.rstrip('_')}", dtype, **rows)
    if op in ("sum", "mean"):
        return _reduction(op, x, dtype, types, concrete)
    if op == "copy_":
        return _copy(x, shapes, dtype, types, memcpy)
    if name in INPLACE_OPS:
        if any(s != x for s in shapes):
            return "broadcasting operands; not sampled"
        return _point("elementwise", name, dtype, **rows)
    if op in ("add", "add_", "mul", "mul_"):
        return _binary(op.rstrip("_"), shapes, dtype, types)
    if op == "gather":
        index = [s for s in shapes[1:] if len(s) == 2]
        if len(x) != 2 or not index or index[0][1] != x[1]:
            return "gather is not of whole rows of a matrix; not sampled"
        return _point("elementwise", "aten::gather", dtype, rows=x[0], tokens=index[0][0], hidden=x[1])
    if op == "embedding" and len(shapes) >= 2 and len(shapes[0]) == 2:
        return _point(
            "embedding", "aten::embedding", dtype, tokens=math.prod(shapes[1]), vocab=shapes[0][0], hidden=shapes[0][1]
        )
    if op in ("nll_loss", "nll_loss_forward", "nll_loss_nd") and len(x) == 2:
        return _point("loss", "aten::nll_loss", dtype, tokens=x[0], vocab=x[1])
    if op == "cross_entropy_loss" and len(x) == 2:
        return _point("loss", "aten::cross_entropy_loss", dtype, tokens=x[0], vocab=x[1])
    return "no sampler for this op"


def _gemm(op: str, shapes: list[list[int]], dtype: str) -> GridPoint | str | None:
    """The GEMM point of a traced mm/addmm/bmm/baddbmm/linear/matmul call; None for other ops."""
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
    return None


def _attention(
    name: str, backward: bool, op: str, dims: list[Any], types: list[Any], causal: bool | None, concrete: list[Any]
) -> GridPoint | str:
    """The point of an attention call: its shape and causality as ``decode.shape_features`` reads them (the
    same reading that fills ``operators``), forward or backward, on the backend the trace ran."""
    row = shape_row(name, dims, types, [str(c) if c is not None else "" for c in concrete])
    if row.get("heads") is None:
        return "attention inputs are not 4-D"
    causal = row.get("causal") if row.get("causal") is not None else causal
    if causal is None:
        return "causality unknown (no is_causal in the trace's Concrete Inputs)"
    dtype = row.get("dtype")
    if dtype not in DTYPE_NAMES:
        return f"dtype {dtype or 'unknown'} is not sampled (only {', '.join(DTYPE_NAMES)})"
    dims_ = {k: row[k] for k in ("batch", "heads", "seq_q", "seq_k", "head_dim")}
    return _point("attention", op, dtype, "bwd" if backward else "fwd", **dims_, causal=bool(causal))


def _embedding_backward(dims: list[Any], types: list[Any], concrete: list[Any]) -> GridPoint | str:
    shapes = _shapes(dims)
    vocab = _concrete(concrete, _NUM_WEIGHTS_ARG)
    if len(shapes) < 2 or not isinstance(vocab, int):
        return "embedding backward without its gradient, indices or num_weights in the trace"
    dtype = _dtype(types, 0)
    if dtype not in DTYPE_NAMES:
        return f"dtype {dtype or 'unknown'} is not sampled (only {', '.join(DTYPE_NAMES)})"
    grad, indices = shapes[0], shapes[1]
    return _point("embedding", "aten::embedding", dtype, "bwd", tokens=math.prod(indices), vocab=vocab, hidden=grad[-1])


def _reduction(op: str, x: list[int], dtype: str, types: list[Any], concrete: list[Any]) -> GridPoint | str:
    """A sum/mean over leading dims (a bias gradient), over trailing dims (row sums) or over all."""
    rank = len(x)
    reduced = _concrete(concrete, 1) if len(types) > 1 and types[1] == "ScalarList" else []
    if not isinstance(reduced, list) or not all(isinstance(d, int) for d in reduced):
        return "reduced dims not in the trace's Concrete Inputs"
    axes = sorted({d % rank for d in reduced}) if reduced else list(range(rank))
    if len(axes) == rank:
        return _point("elementwise", f"aten::{op}", dtype, tokens=math.prod(x[:-1]) or 1, hidden=x[-1], reduce="all")
    if axes == list(range(len(axes))):  # leading dims: [tokens, hidden] summed over tokens
        return _point(
            "elementwise", f"aten::{op}", dtype, tokens=math.prod(x[: len(axes)]), hidden=math.prod(x[len(axes) :])
        )
    if axes == list(range(rank - len(axes), rank)):  # trailing dims
        split = rank - len(axes)
        return _point("elementwise", f"aten::{op}", dtype, tokens=math.prod(x[:split]), hidden=math.prod(x[split:]),
                      reduce="last")  # fmt: skip
    return "reduction over interleaved dims; not sampled"


def _copy(x: list[int], shapes: list[list[int]], dtype: str, types: list[Any], memcpy: str | None) -> GridPoint | str:
    if len(shapes) < 2 or math.prod(shapes[1]) != math.prod(x):
        return "broadcasting copy; not sampled"
    src_dtype = _dtype(types, 1)
    if src_dtype not in DTYPE_NAMES:
        return f"copy from dtype {src_dtype or 'unknown'} is not sampled"
    src = "device"
    if memcpy:
        found = [s for kind, memory, s in _MEMCPY_SOURCE if kind in memcpy and memory in memcpy]
        if not found:
            return f"{memcpy.split(' (')[0]} is not sampled (host-to-device and device-to-device are)"
        src = found[0]
    return _point("elementwise", "aten::copy_", dtype, **_rows(x), src_dtype=src_dtype if src_dtype != dtype else None,
                  src=src if src != "device" else None)  # fmt: skip


def _binary(op: str, shapes: list[list[int]], dtype: str, types: list[Any]) -> GridPoint | str:
    """add/mul of two tensors, the second of the first's shape or broadcast over its leading dims."""
    if len(shapes) < 2:
        return "scalar operand; not sampled"
    x, other = shapes[0], shapes[1]
    other_dtype = _dtype(types, 1)
    if other_dtype not in DTYPE_NAMES:
        return f"operand dtype {other_dtype or 'unknown'} is not sampled"
    while len(other) > 1 and other[0] == 1:  # [1, h] broadcasts like [h]
        other = other[1:]
    if len(other) > len(x) or x[len(x) - len(other) :] != other:
        return "operands broadcast other than over leading dims; not sampled"
    copies = math.prod(x) // math.prod(other)
    return _point("elementwise", f"aten::{op}", dtype, **_rows(other), broadcast=copies if copies > 1 else None,
                  other_dtype=other_dtype if other_dtype != dtype else None)  # fmt: skip


def _cat(dims: list[Any], list_dtype: str | None) -> GridPoint | str:
    tensors = [s for s in (dims[0] if dims and isinstance(dims[0], list) else []) if isinstance(s, list) and s]
    if not tensors or not all(isinstance(d, int) for s in tensors for d in s):
        return "no tensor shapes in the TensorList"
    if len({tuple(s[:-1]) for s in tensors}) > 1:
        return "cat of tensors with different leading dims; not sampled"
    if list_dtype is None:
        return "element type not in the trace (TensorList, and no element size in the kernel name)"
    tokens = math.prod(tensors[0][:-1]) if len(tensors[0]) > 1 else 1
    hidden = max(1, round(sum(math.prod(s) for s in tensors) / (len(tensors) * tokens)))
    return _point("elementwise", "aten::cat", list_dtype, tensors=len(tensors), tokens=tokens, hidden=hidden)


def parameter_groups(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, StepParameters]:
    """Per rank, the parameters its optimizer steps (``decode.parameters``) in the best iteration."""
    return decoded_parameter_groups(query_file(con, "run_parameters", [run_id]).to_pylist())


def _step_impl(ops: set[str]) -> str:
    """How a traced optimizer step ran, from the ops inside it."""
    if any("_fused_" in op for op in ops):
        return "fused"
    if any("_foreach_" in op for op in ops):
        return "foreach"
    return "forloop"


def _half_dtype(rows: list[dict[str, Any]]) -> str:
    """The run's 2-byte float type (bfloat16 or float16), by operator time."""
    time: Counter[str] = Counter()
    for r in rows:
        types = orjson.loads(r["input_types"]) if r["input_types"] else []
        dtype = _dtype(types, 0)
        if dtype in ("bfloat16", "float16"):
            time[dtype] += int(r["total_ns"] or 0)
    return time.most_common(1)[0][0] if time else "bfloat16"


def run_points(con: duckdb.DuckDBPyConnection, run_id: str, dtypes: list[str] | None = None) -> RunPlan:
    """The grid points that re-run the calls of ``run_id``'s best iteration (see the module
    docstring), with the time they cover.

    ``dtypes`` keeps only calls of those dtypes (and is the element type assumed for TensorList
    arguments a trace does not type). Points come out in order of the traced time they stand for,
    largest first, without duplicates.

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
    rows = query_file(con, "run_op_shapes", [run_id]).to_pylist()
    if not any(r["cpu_op_name"] for r in rows):
        raise SampleError(f"run {run_id!r} has no compute operators (gemm, attention, ...) to sample")
    plan = RunPlan(run_id, training=any(r["phase"] == "bwd" for r in rows))
    plan.gpu = con.execute(
        "SELECT count(*) > 0 FROM operators WHERE run_id = ? AND kind IN ('kernel', 'memcpy', 'memset')", [run_id]
    ).fetchall() == [(True,)]
    half = _half_dtype(rows)
    steps = _steps(con, run_id, rows)
    for r in rows:
        time_ns = int(r["total_ns"] or 0)
        plan.total_ns += time_ns
        mapped = _map_row(r, steps, dtypes, half)
        label = r["cpu_op_name"] or r["activity"] or "?"
        if isinstance(mapped, str):
            key = (label, mapped)
            if r["cpu_op_name"]:
                plan.unmapped[key] = plan.unmapped.get(key, 0) + 1
            plan.uncovered[key] = plan.uncovered.get(key, 0) + time_ns
            continue
        if dtypes and mapped.dtype not in dtypes:
            plan.uncovered[(label, f"dtype {mapped.dtype} left out by --dtype")] = time_ns
            continue
        plan.covered_ns += time_ns
        directions = [mapped.direction]
        if (mapped.direction == "fwd" and plan.training and r["phase"] == "fwd" and mapped.family != "gemm"
                and OP_SPECS[(mapped.family, mapped.op)].has_backward):  # fmt: skip
            directions.append("bwd")  # also when the trace does not show the backward op on its own
        for direction in directions:  # the traced time belongs to the call's own direction
            point = GridPoint(mapped.family, mapped.op, direction, mapped.dtype, mapped.dims)
            _add(plan, point, r, time_ns if direction == mapped.direction else 0)
    plan.points.sort(key=lambda p: -plan.traced[p]["traced_ns"])
    return plan


def _add(plan: RunPlan, point: GridPoint, row: dict[str, Any], time_ns: int) -> None:
    info = plan.traced.get(point)
    if info is None:
        plan.points.append(point)
        info = plan.traced[point] = {"traced_ops": [], "traced_phases": [], "traced_operators": 0, "traced_ns": 0}
    op = row["cpu_op_name"] or row["activity"]
    if op not in info["traced_ops"]:
        info["traced_ops"].append(op)
    if row["phase"] not in info["traced_phases"]:
        info["traced_phases"].append(row["phase"])
    info["traced_operators"] += int(row["operators"])
    info["traced_ns"] += time_ns


def _steps(
    con: duckdb.DuckDBPyConnection, run_id: str, rows: list[dict[str, Any]]
) -> dict[tuple[int, str], GridPoint | str]:
    """(rank, Optimizer.step#<Class>.step) -> the step's point, or why it cannot be sampled."""
    inside: dict[tuple[int, str], set[str]] = {}
    for r in rows:
        if r["optimizer_step"]:
            inside.setdefault((r["step_rank"], r["optimizer_step"]), set()).add(r["cpu_op_name"] or "")
    if not inside:
        return {}
    groups = parameter_groups(con, run_id)
    out: dict[tuple[int, str], GridPoint | str] = {}
    for (rank, step), ops in inside.items():
        if ("optimizer", step) not in OP_SPECS:
            which = _OPTIMIZER_STEP.match(step)
            out[(rank, step)] = f"no sampler for the {which.group(1) if which else step} optimizer"
        elif rank not in groups:
            out[(rank, step)] = "parameters unknown (no torch::autograd::AccumulateGrad in the iteration)"
        elif (dtype := groups[rank].dtype) is None or dtype not in DTYPE_NAMES:
            out[(rank, step)] = f"parameter dtype {dtype or 'unknown'} is not sampled"
        else:
            p = groups[rank]
            out[(rank, step)] = _point("optimizer", step, dtype, params=p.params, tensors=p.tensors,
                                       impl=_step_impl(ops))  # fmt: skip
    return out


def _map_row(
    r: dict[str, Any], steps: dict[tuple[int, str], GridPoint | str], dtypes: list[str] | None, half: str
) -> GridPoint | str:
    """The point one traced call (a ``run_op_shapes`` row) stands for, or why there is none."""
    if r["optimizer_step"]:
        return steps[(r["step_rank"], r["optimizer_step"])]
    if not r["cpu_op_name"]:
        return "no CPU operator launched it in the trace"
    dims = orjson.loads(r["input_dims"]) if r["input_dims"] else []
    types = orjson.loads(r["input_types"]) if r["input_types"] else []
    concrete = orjson.loads(r["concrete_inputs"]) if r["concrete_inputs"] else []
    list_dtype = dtypes[0] if dtypes else None
    size = r["list_element_bytes"]
    if list_dtype is None and size:
        list_dtype = next((d for d in (half, "float32") if DTYPE_BYTES[d] == size), None)
    return map_call(r["cpu_op_name"], dims, types, r["causal"], list_dtype, concrete=concrete, memcpy=r["memcpy"])

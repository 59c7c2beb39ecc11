"""Shape features from operator names, Input Dims and Input type (docs/decode.md#families).

This module is the join between traced operators and microbenchmark samples: the decoder calls it on
``operators`` and the samplers/calibration call the same functions on samples, so a feature means the
same thing on both sides. The features are ``schema.SHAPE_COLUMNS`` (declared there once). Pure
functions, no I/O.

- ``shape_row(name, input_dims, input_types, concrete_inputs=None) -> dict`` the SHAPE_COLUMNS of
  one operator (``input_dims``/``input_types`` as JSON text or already-decoded lists);
- ``shape_features(frame, name=..., input_dims=..., input_types=..., concrete_inputs=...)`` adds (or
  replaces) every ``schema.SHAPE_COLUMNS`` column on a polars frame;
- ``family_shape_table(frame)``: the family (``decode.families``) and the features of each distinct
  operator signature in one pass, for the decoder to join back.

Unknown or unparseable shapes leave the features NULL (never 0, never a guess).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import orjson
import polars as pl

from tracecal.decode.families import families_of, family_of
from tracecal.decode.nesting import ENGINE
from tracecal.ingest.input_dims import argument_shapes, is_shape, joins_tensors
from tracecal.schema import SHAPE_COLUMNS, polars_schema

_DTYPES = {
    "float": "float32",
    "float32": "float32",
    "c10::float": "float32",
    "double": "float64",
    "c10::half": "float16",
    "half": "float16",
    "float16": "float16",
    "c10::bfloat16": "bfloat16",
    "bfloat16": "bfloat16",
    "c10::float8_e4m3fn": "float8_e4m3fn",
    "c10::float8_e5m2": "float8_e5m2",
    "long int": "int64",
    "long": "int64",
    "int": "int32",
    "short int": "int16",
    "signed char": "int8",
    "unsigned char": "uint8",
    "bool": "bool",
}
DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
"""Bytes per element of the normalised dtypes."""


def normalize_dtype(raw: str | None) -> str | None:
    """Profiler type strings (``float``, ``c10::Half``, ``c10::BFloat16``, ``Float``) -> torch-style names."""
    if not raw:
        return None
    return _DTYPES.get(raw.strip().lower())


def _decode(value: Any) -> Any:
    if value is None or isinstance(value, list):
        return value
    if not isinstance(value, (str, bytes)):
        return None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return None


def _tensors(dims: list[Any], types: list[Any]) -> list[tuple[list[int], str | None]]:
    """Tensor arguments as (shape, dtype); scalars/empty args dropped, tensor lists flattened
    (``input_dims.argument_shapes``)."""
    out: list[tuple[list[int], str | None]] = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else None
        dtype = normalize_dtype(t) if isinstance(t, str) else None
        out.extend((shape, dtype) for shape in argument_shapes(d))
    return out


def _prod(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _gemm(name: str, ts: list[tuple[list[int], str | None]]) -> dict[str, Any] | None:
    shapes = [s for s, _ in ts]
    op = name.split("::")[-1]
    if op in ("mm",) and len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        return {"batch": 1, "m": m, "n": n, "k": k}
    if op in ("addmm", "_addmm_activation") and len(shapes) >= 3 and len(shapes[1]) == 2 and len(shapes[2]) == 2:
        (m, k), (_, n) = shapes[1], shapes[2]
        return {"batch": 1, "m": m, "n": n, "k": k}
    if op == "bmm" and len(shapes) >= 2 and len(shapes[0]) == 3 and len(shapes[1]) == 3:
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
        return {"batch": b, "m": m, "n": n, "k": k}
    if op == "baddbmm" and len(shapes) >= 3 and len(shapes[1]) == 3 and len(shapes[2]) == 3:
        (b, m, k), (_, _, n) = shapes[1], shapes[2]
        return {"batch": b, "m": m, "n": n, "k": k}
    if op == "linear" and len(shapes) >= 2 and len(shapes[1]) == 2 and shapes[0]:
        x, w = shapes[0], shapes[1]
        return {"batch": 1, "m": _prod(x[:-1]), "n": w[0], "k": w[1]}
    if op == "matmul" and len(shapes) >= 2 and shapes[0] and shapes[1]:
        a, b_ = shapes[0], shapes[1]
        if len(b_) == 1:
            return {"batch": 1, "m": _prod(a[:-1]), "n": 1, "k": b_[0]}
        if len(b_) == 2:  # broadcasting a 2-D weight folds A's batch dims into M
            return {"batch": 1, "m": _prod(a[:-1]), "n": b_[1], "k": b_[0]}
        batch = max(_prod(a[:-2]), _prod(b_[:-2]))
        return {"batch": batch, "m": a[-2] if len(a) >= 2 else 1, "n": b_[-1], "k": b_[-2]}
    return None


_IS_CAUSAL_ARG = {
    "scaled_dot_product_attention": 5,
    "_scaled_dot_product_flash_attention": 4,
    "_scaled_dot_product_flash_attention_backward": 11,
    "_scaled_dot_product_flash_attention_for_cpu": 4,
    "_scaled_dot_product_flash_attention_for_cpu_backward": 7,
    "_scaled_dot_product_efficient_attention": 6,
    "_scaled_dot_product_cudnn_attention": 6,
    "_flash_attention_forward": 8,
    "_flash_attention_backward": 11,
    "_scaled_dot_product_efficient_attention_backward": 11,
    "_scaled_dot_product_cudnn_attention_backward": 14,
    "_cudnn_attention_forward": 10,
    "_cudnn_attention_backward": 14,
    "_scaled_dot_product_attention_math": 5,
}
"""Position of ``is_causal`` in Concrete Inputs per attention op (the aten signatures)."""

_MASK_TYPE_ARG = {"_efficient_attention_forward": 9, "_efficient_attention_backward": 14}
"""Position of ``custom_mask_type`` (0: none, 1: causal from the top left, 2: from the bottom
right) in the memory-efficient kernels' signatures, which take it instead of ``is_causal``."""

_DAO_LAYOUT_OPS = frozenset(
    {"_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
     "_efficient_attention_backward"}
)  # fmt: skip
"""aten ops that take [batch, seq, heads, head_dim] (Dao's flash-attn layout) instead of SDPA's
[batch, heads, seq, head_dim]."""


_DAO_LAYOUT_NAME = re.compile(r"(?i)flash_?attn")
"""Flash-attn's own ops and autograd Function (``flash_attn::_flash_attn_forward``,
``FlashAttnFunc``, ``FlashAttnFuncBackward``) take Dao's layout; torch's SDPA flash ops do not."""


def _attention(name: str, ts: list[tuple[list[int], str | None]], concrete: list[Any]) -> dict[str, Any] | None:
    shapes = [s for s, _ in ts if len(s) == 4]
    backward = "backward" in name.lower() or "bwd" in name.lower()
    if backward and len(shapes) >= 4:  # grad_out, q, k, v
        shapes = shapes[1:]
    if backward and len(shapes) == 1:
        # an autograd node records only the output gradient, shaped like q: self-attention, so
        # the keys have the queries' length
        shapes = shapes * 2
    if len(shapes) < 2:
        return None
    q, k = shapes[0], shapes[1]
    op = name.split("::")[-1]
    if op in _DAO_LAYOUT_OPS or (_DAO_LAYOUT_NAME.search(name) and "scaled_dot" not in name.lower()):
        b, sq, h, d = q  # Dao flash_attn layout [batch, seq, heads, head_dim]
        sk = k[1]
    else:
        b, h, sq, d = q  # torch SDPA layout [batch, heads, seq, head_dim]
        sk = k[2]
    causal = None
    pos = _IS_CAUSAL_ARG.get(op)
    if pos is not None and pos < len(concrete) and concrete[pos] in ("True", "False"):
        causal = concrete[pos] == "True"
    mask = _MASK_TYPE_ARG.get(op)
    if mask is not None and mask < len(concrete) and concrete[mask] in ("0", "1", "2"):
        causal = concrete[mask] != "0"
    return {"batch": b, "heads": h, "seq_q": sq, "seq_k": sk, "head_dim": d, "causal": causal, "_bwd": backward}


def _io(ts: list[tuple[list[int], str | None]], out_elements: int | None, nbytes: int | None) -> float | None:
    if nbytes is None:
        return None
    total = sum(_prod(s) for s, _ in ts) + (out_elements or 0)
    return float(total * nbytes)


@lru_cache(maxsize=65536)
def _shape_row_cached(
    name: str, dims: str | None, types: str | None, concrete: str | None, list_bytes: int | None = None
) -> tuple[Any, ...]:
    row = shape_row(name, dims, types, concrete, list_element_bytes=list_bytes)
    return tuple(row[c.name] for c in SHAPE_COLUMNS)


LIST_ELEMENT_BYTES = re.compile(r"OpaqueType<(\d+)u?>")
"""A kernel that moves a TensorList's elements as raw words names their size
(``CatArrayBatchedCopy<OpaqueType<2u>, ...>``): the one element type a trace holds for a TensorList
argument, whose ``Input type`` is just ``TensorList``."""


def kernel_element_bytes(kernel_name: str | None) -> int | None:
    """The element size a TensorList kernel names (``LIST_ELEMENT_BYTES``), else None."""
    found = LIST_ELEMENT_BYTES.search(kernel_name) if kernel_name else None
    return int(found.group(1)) if found else None


def shape_row(
    name: str | None,
    input_dims: str | list[Any] | None,
    input_types: str | list[Any] | None,
    concrete_inputs: str | list[Any] | None = None,
    *,
    list_element_bytes: int | None = None,
) -> dict[str, Any]:
    """The SHAPE_COLUMNS of one operator (docs/decode.md#families); NULL (None) where not derivable.

    Args:
        name: CPU operator name (``aten::mm``, ``aten::_scaled_dot_product_flash_attention``, ...).
        input_dims: Kineto ``Input Dims`` (JSON text or list), e.g. ``[[8,512],[512,1024]]``.
        input_types: Kineto ``Input type``, e.g. ``["float","float"]``.
        concrete_inputs: Kineto ``Concrete Inputs`` (used for ``is_causal``).
        list_element_bytes: element size of TensorList arguments, which a trace records untyped: what
            the operator's kernel name says (``kernel_element_bytes``), or the dtype a sampler used.

    Returns:
        ``{column: value}`` for every column of ``schema.SHAPE_COLUMNS``. GEMM: M, N, K, batch and
        flops = 2·M·N·K·batch. Attention: batch, heads, seq_q, seq_k, head_dim, causal and flops =
        4·b·h·sq·sk·d (halved when causal; ×2.5 for backward). Softmax/norm/elementwise/loss:
        elements of the first tensor, and (elementwise) ``io_bytes`` with each tensor at its own
        dtype (``_elementwise_io``); softmax/norm also ``hidden`` = the reduced (row) length and
        ``tokens`` = rows. Embedding: tokens, vocab, hidden. Optimizer: params, ``batch`` = tensors
        updated, ``hidden`` = most common 1-D tensor length (see ``_optimizer``).
    """
    out: dict[str, Any] = {c.name: None for c in SHAPE_COLUMNS}
    if not name:
        return out
    dims = _decode(input_dims) or []
    types = _decode(input_types) or []
    concrete = _decode(concrete_inputs) or []
    if not isinstance(dims, list):
        return out
    ts = _tensors(dims, types if isinstance(types, list) else [])
    if not ts:
        return out
    dtype = next((t for _, t in ts if t), None)
    nbytes = DTYPE_BYTES.get(dtype) if dtype else None
    out["dtype"] = dtype
    fam = family_of(name)
    if fam == "gemm":
        g = _gemm(name, ts)
        if g:
            out.update(g)
            out["flops"] = 2.0 * g["m"] * g["n"] * g["k"] * g["batch"]
            if nbytes:
                out["io_bytes"] = float((g["m"] * g["k"] + g["k"] * g["n"] + g["m"] * g["n"]) * g["batch"] * nbytes)
        return out
    if fam == "attention":
        a = _attention(name, ts, concrete if isinstance(concrete, list) else [])
        if a:
            bwd = a.pop("_bwd")
            out.update(a)
            flops = 4.0 * a["batch"] * a["heads"] * a["seq_q"] * a["seq_k"] * a["head_dim"]
            if a["causal"]:
                flops /= 2
            out["flops"] = flops * (2.5 if bwd else 1.0)
            out["io_bytes"] = _io(ts, a["batch"] * a["heads"] * a["seq_q"] * a["head_dim"], nbytes)
        return out
    first = ts[0][0]
    if fam == "embedding":
        # aten::embedding(weight[vocab, hidden], indices[...]); embedding_bag the same order
        two_d = [s for s, _ in ts if len(s) == 2]
        if two_d:
            weight = two_d[0]
            idx = next((s for s, _ in ts if s is not weight), None)
            out.update({"vocab": weight[0], "hidden": weight[1], "tokens": _prod(idx) if idx else None})
            if "backward" in name.lower() and idx is not None:  # grad[tokens, hidden], indices
                out.update({"tokens": _prod(first[:-1]), "hidden": first[-1], "vocab": None})
        return out
    if fam == "optimizer":
        out.update(_optimizer(dims, first))
        return out
    if fam == "loss":
        out["elements"] = _prod(first)
        if len(first) >= 2:
            out["tokens"], out["vocab"] = _prod(first[:-1]), first[-1]
        out["io_bytes"] = _io(ts, None, nbytes)
        return out
    if fam == "elementwise" and joins_tensors(name) and argument_shapes(dims[0]):
        # cat / stack: the output holds every tensor of the list; each is read once and written once
        joined = sum(_prod(s) for s in argument_shapes(dims[0]))
        out["elements"] = joined
        size = nbytes or list_element_bytes
        out["io_bytes"] = float(2 * joined * size) if size else None
        return out
    if fam in ("softmax", "norm", "elementwise"):
        out["elements"] = _prod(first)
        if fam == "softmax" and _UPPER_TRIANGLE.search(name):
            out["causal"] = True  # the upper triangle of every score row is masked by definition
        if fam in ("softmax", "norm"):
            # a row-wise reduction: its kernel is chosen by the row length (warp per row up to a
            # few thousand elements, block per row beyond), so rows × width is not just elements
            width = first[_reduced_axis(name, first, concrete if isinstance(concrete, list) else [])]
            out["hidden"] = width
            out["tokens"] = _prod(first) // width if width else None
        out["io_bytes"] = _io(ts, _prod(first), nbytes) if fam != "elementwise" else _elementwise_io(name, ts, nbytes)
        return out
    return out


_UPPER_TRIANGLE = re.compile(r"(?i)upper_?triang")
"""Softmax ops that mask the upper triangle (Megatron's ``ScaledUpperTriangMaskedSoftmax``): causal."""

_REDUCTIONS = frozenset({"sum", "mean", "norm", "linalg_vector_norm", "amax", "amin", "max", "min", "prod",
                         "var", "std", "argmax", "argmin", "all", "any", "logsumexp"})  # fmt: skip
"""Element-wise-family ops that reduce: they read their input and write a much smaller output."""

_WRITE_ONLY = frozenset({"fill", "zero", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like"})
"""Element-wise-family ops that only write their (first) tensor."""


_OVERWRITES = frozenset({"copy"})
"""Element-wise-family ops that write their first tensor without reading it (``copy_(dst, src)``)."""

_PREDICATES = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
                         "logical_xor", "isnan", "isinf", "isfinite"})  # fmt: skip
"""Element-wise-family ops whose output is bool whatever their inputs."""


def _elementwise_io(name: str, ts: list[tuple[list[int], str | None]], nbytes: int | None) -> float | None:
    """Bytes an element-wise op moves, each tensor at its own element size, so that a cast (a
    ``copy_`` from float32 into bfloat16) is not a same-dtype copy:

    - read: every tensor argument, except the destination a ``copy_`` overwrites (a ``gather``
      reads its index and only the elements it names, whether or not the trace records an ``out``);
    - written: a fill's or a ``copy_``'s first tensor; an in-place op's (``add_``) first tensor, at
      its own dtype; an out-of-place op's largest (broadcast) shape, at the dtype torch's type
      promotion gives its tensors (bool for a comparison); nothing worth counting for a reduction.

    A tensor whose type the trace did not record counts at the first recorded one (``nbytes``);
    None when no tensor has one."""
    if nbytes is None:
        return None
    op = name.split("::")[-1]
    base = op.rstrip("_")
    sized = [(_prod(s), DTYPE_BYTES.get(t, nbytes) if t else nbytes) for s, t in ts]
    first = sized[0][0] * sized[0][1]
    largest = max(n for n, _ in sized)
    if base in _WRITE_ONLY:
        return float(largest * sized[0][1])
    if base in _OVERWRITES:
        return float(first + sum(n * size for n, size in sized[1:]))
    if base == "gather" and len(sized) >= 2:  # reads its index and the elements it names, writes those
        (index, index_size), value_size = sized[1], sized[0][1]
        return float(index * (index_size + 2 * value_size))
    read = sum(n * size for n, size in sized)
    if base in _REDUCTIONS:
        return float(read)
    if op.endswith("_"):
        return float(read + first)
    out = DTYPE_BYTES["bool"] if base in _PREDICATES else promoted_bytes([t for _, t in ts]) or nbytes
    return float(read + largest * out)


def promoted_bytes(dtypes: Sequence[str | None]) -> int | None:
    """Element size of the dtype torch's type promotion gives tensors of ``dtypes`` (normalised
    names): floating types win over integers and bool, the widest wins, and float16 with bfloat16
    gives float32. None when no dtype is known."""
    known = {d for d in dtypes if d in DTYPE_BYTES}
    if not known:
        return None
    floats = {d for d in known if d.startswith(("float", "bfloat"))}
    if {"float16", "bfloat16"} <= floats and not floats & {"float32", "float64"}:
        return DTYPE_BYTES["float32"]
    return max(DTYPE_BYTES[d] for d in (floats or known))


_SOFTMAX_DIM_ARG = {"_softmax": 1, "softmax": 1, "_log_softmax": 1, "log_softmax": 1,
                    "_softmax_backward_data": 2, "_log_softmax_backward_data": 2}  # fmt: skip
"""Position of ``dim`` in Concrete Inputs per softmax op (the aten signatures)."""


def _reduced_axis(name: str, first: list[int], concrete: list[Any]) -> int:
    """Axis of ``first`` a softmax/norm reduces over: the softmax ``dim`` when Concrete Inputs give
    it, else the last (norms normalise trailing dimensions; softmax over the last is the rule)."""
    pos = _SOFTMAX_DIM_ARG.get(name.split("::")[-1])
    if pos is not None and pos < len(concrete):
        try:
            dim = int(concrete[pos])
        except (TypeError, ValueError):
            return len(first) - 1
        if -len(first) <= dim < len(first):
            return dim % len(first)
    return len(first) - 1


def _optimizer(dims: list[Any], first: list[int]) -> dict[str, Any]:
    """Optimizer features: ``params`` (elements updated), ``batch`` (tensors updated) and ``hidden``.

    foreach/fused optimizers (``_fused_adamw_``, ``_foreach_*``) take TensorLists (params, grads,
    states...); the first list is the parameters. Their time is not params alone: multi-tensor
    kernels work in per-tensor chunks and launch per group of tensors, so the tensor count matters.
    ``hidden`` is the model width: the most common length of the 1-D tensors (LayerNorm weights and
    biases, row-parallel biases; ties go to the longer) among the lengths that are also a dimension
    of a weight matrix. NULL when there is no such length, e.g. a flat list of 1-D buffers, whose
    lengths say nothing about a width.
    """
    shapes = [s for s in dims[0] if s] if _is_list_op(dims) else [first]
    params = sum(_prod(s) for s in shapes)
    matrix_dims = {d for s in shapes if len(s) >= 2 for d in s}
    lengths: dict[int, int] = {}
    for s in shapes:
        if len(s) == 1 and s[0] in matrix_dims:
            lengths[s[0]] = lengths.get(s[0], 0) + 1
    hidden = max(lengths, key=lambda n: (lengths[n], n)) if lengths else None
    return {"params": params, "elements": params, "batch": len(shapes), "hidden": hidden}


def _is_list_op(dims: list[Any]) -> bool:
    """True when the first argument is a TensorList (foreach / fused optimizers)."""
    return bool(dims) and isinstance(dims[0], list) and bool(dims[0]) and all(is_shape(x) for x in dims[0])


_SHAPE_SCHEMA = polars_schema(SHAPE_COLUMNS)


def family_shape_table(
    frame: pl.DataFrame,
    *,
    name: str = "cpu_op_name",
    kernel_name: str = "name",
    kind: str = "kind",
    input_dims: str = "input_dims",
    input_types: str = "input_types",
    concrete_inputs: str = "cpu_concrete_inputs",
) -> pl.DataFrame:
    """One row per distinct (op, kernel, kind, dims, types, concrete inputs) of ``frame``: those six
    key columns plus ``family`` (``with_family``) and every ``schema.SHAPE_COLUMNS`` column
    (``shape_features``), for the caller to join back (``nulls_equal=True``) inside its own plan:
    both answers from one pass over the distinct keys instead of two distinct/join rounds."""
    keys = [name, kernel_name, kind, input_dims, input_types, concrete_inputs]
    distinct = frame.lazy().select(keys).unique().collect(engine=ENGINE)  # one plan, not two
    # column lists in and Series out, not rows: cheaper than a frame built from row tuples (and
    # ``to_list`` per column is cheaper than ``iter_rows``)
    ops, kernels, kinds, dims, types, concrete = (s.to_list() for s in distinct.get_columns())
    families = families_of(list(zip(ops, kernels, kinds, strict=True)))
    # a TensorList's element size is in its kernel's name (only asked where a TensorList is)
    list_bytes = [
        kernel_element_bytes(k) if t and "TensorList" in t else None for k, t in zip(kernels, types, strict=True)
    ]
    rows = [
        _shape_row_cached(op or "", *rest) for op, *rest in zip(ops, dims, types, concrete, list_bytes, strict=True)
    ]
    values = list(zip(*rows, strict=True)) if rows else [()] * len(_SHAPE_SCHEMA)
    # not strict, as the row constructor was not (an int in a float column, a float in an int one)
    feats = [pl.Series(c, v, dtype=t, strict=False) for (c, t), v in zip(_SHAPE_SCHEMA.items(), values, strict=True)]
    return with_known_causality(
        distinct.hstack([pl.Series("family", families, dtype=pl.Utf8), *feats]), name, kernel_name
    )


FLASH_KERNEL_CAUSAL = re.compile(r"flash_(?:fwd|bwd)\w*_kernel<.*>\s*>,\s*(?:true|false),\s*(true|false)\b")
"""Flash-attention 2 kernels name their template flags after the kernel traits: ``Is_dropout``, then
``Is_causal`` (``flash_fwd_kernel<Traits>, false, true, ...>``)."""


def with_known_causality(table: pl.DataFrame, name: str, kernel_name: str) -> pl.DataFrame:
    """Attention rows whose arguments did not say whether they are causal: the flag a flash-attention
    kernel's name carries, then the flag shared by the other kernels of the same operator and shape,
    then (an autograd node ``XBackward`` records no scalar arguments) the flag of its forward ``X``
    when every call of ``X`` agrees."""
    if table.height == 0 or not (table.get_column("family") == "attention").any():
        return table
    attention = pl.col("family") == "attention"
    unknown = table.get_column("causal").is_null()
    from_kernel = pl.col(kernel_name).str.extract(FLASH_KERNEL_CAUSAL.pattern, 1) == "true"
    table = table.with_columns(
        pl.when(attention & pl.col("causal").is_null()).then(from_kernel).otherwise(pl.col("causal")).alias("causal")
    )
    same_call = pl.col("causal").drop_nulls().unique()
    agreed = (
        table.filter(attention & pl.col(name).is_not_null())
        .group_by(name)
        .agg(same_call.alias("_flags"))
        .filter(pl.col("_flags").list.len() == 1)
    )
    flags = dict(zip(agreed[name].to_list(), agreed["_flags"].list.first().to_list(), strict=True))
    inherited = {**{f"{op}Backward": flag for op, flag in flags.items()}, **flags}
    fill = pl.col(name).replace_strict(inherited, default=None, return_dtype=pl.Boolean)
    table = table.with_columns(
        pl.when(attention & pl.col("causal").is_null()).then(fill).otherwise(pl.col("causal")).alias("causal")
    )
    # the flops were derived without the mask: a causal one skips half the score matrix
    halved = pl.Series(unknown) & table.get_column("causal").fill_null(False)
    return table.with_columns(pl.when(halved).then(pl.col("flops") / 2).otherwise(pl.col("flops")).alias("flops"))


def shape_features(
    frame: pl.DataFrame,
    *,
    name: str = "cpu_op_name",
    input_dims: str = "input_dims",
    input_types: str = "input_types",
    concrete_inputs: str | None = None,
) -> pl.DataFrame:
    """``frame`` with every ``schema.SHAPE_COLUMNS`` column filled (replacing existing ones).

    Shapes repeat (a training step runs the same few hundred signatures thousands of times), so
    features are computed once per distinct (name, dims, types, concrete) and joined back.
    """
    keys = [name, input_dims, input_types] + ([concrete_inputs] if concrete_inputs else [])
    base = frame.drop([c for c in _SHAPE_SCHEMA if c in frame.columns])
    if frame.height == 0:
        return base.with_columns([pl.lit(None, dtype=t).alias(c) for c, t in _SHAPE_SCHEMA.items()])
    distinct = base.select(keys).unique()
    rows = [_shape_row_cached(r[0] or "", r[1], r[2], r[3] if concrete_inputs else None) for r in distinct.iter_rows()]
    cols = list(_SHAPE_SCHEMA)
    feats = pl.DataFrame(rows, schema=_SHAPE_SCHEMA, orient="row") if rows else pl.DataFrame(schema=_SHAPE_SCHEMA)
    table = pl.concat([distinct, feats.select(cols)], how="horizontal")
    return base.join(table, on=keys, how="left", nulls_equal=True)

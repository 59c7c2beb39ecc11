"""What each published GPUModeling25 microbenchmark measured, as our families and shape features.

One entry per op file name (docs/samples.md#importing-the-published-gpumodeling25-csvs): the CSV
columns it must have, our family, and a function from one CSV row to the ``SHAPE_COLUMNS`` of the
forward call it timed.

Features are filled by ``tracecal.decode.shape_features.shape_row`` from the aten call the op is made of (its
Input Dims as a trace would record them), so an imported sample and a traced operator of the same
shape get the same M/N/K, elements, flops and io_bytes. Conventions the published data imposes:

- ``t`` = ``mp`` (the TP size the shape was derived for, stored in ``tp``), ``b`` micro-batch,
  ``l`` sequence, ``h`` = ``dim`` hidden size, ``heads`` = the ``h`` column of attention files;
- the vocabulary is GPT-2's 50 257 tokens padded per TP rank to ``ceil(50257 / (128·t))·128``;
- forward and backward rows carry the *forward* call's features (the published convention; a bwd
  regressor maps the forward shape to the backward time), dtype float16;
- ``fillmask`` (baddbmm + masked_fill + softmax) has family softmax, ``elements`` of its score
  tensor, the flops of its baddbmm and io_bytes of all three steps;
- ``RoPE`` is elementwise over ``[l, b, heads/t, h/heads]`` (input and output counted in io_bytes);
- ``softmax``, ``fillmask`` and ``ScaledUpperTriangMaskedSoftmax`` rows get ``hidden`` = the softmax
  row length ``l`` and ``tokens`` = rows (``b·heads/t·l``), as a traced ``aten::_softmax`` does;
- stage optimizers: FusedAdam over the published sampler's toy stage, recorded as the TensorList
  of its parameter tensors (Linear h→3h/t, h/t→h, h→4h/t, 4h/t→h with biases and two LayerNorms per
  encoder, plus the embedding for the first and a LayerNorm and the vocab projection for the last
  stage), so ``params`` = elements, ``batch`` = tensors and ``hidden`` = h as for a traced
  ``_fused_adam_``;
- the legacy ``optimizer`` file gives ``params``, ``batch`` = ``param_tensors`` and ``hidden`` =
  ``hidden_size`` directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tracecal.decode.shape_features import shape_row

VOCAB = 50257
"""GPT-2 vocabulary the published samplers padded (megatron ``padded_vocab_size``)."""

HALF = "c10::Half"
LONG = "long int"


def padded_vocab_per_rank(tp: int) -> int:
    """Rows of the vocab-parallel embedding / output layer on one of ``tp`` ranks."""
    return math.ceil(VOCAB / (128 * tp)) * 128


def _div(a: int, b: int, what: str) -> int:
    if b <= 0 or a % b:
        raise ValueError(f"{what} = {a}/{b} is not a whole number")
    return a // b


Row = Mapping[str, int]
Features = dict[str, Any]


@dataclass(frozen=True)
class OpSpec:
    """A published compute op: CSV shape columns, our family, and its features from one row."""

    columns: tuple[str, ...]
    family: str
    features: Callable[[Row], Features]
    tp_column: bool = True
    """True when the file has an ``mp`` column (the row's TP size goes to ``tp``)."""


def _gemm(x: list[int], w: list[int]) -> Features:
    return shape_row("aten::linear", [x, w], [HALF, HALF])


def _linear(k: Callable[[int, int], int], n: Callable[[int, int], int]) -> Callable[[Row], Features]:
    def features(r: Row) -> Features:
        t, h = r["mp"], r["dim"]
        return _gemm([r["b"], r["l"], k(h, t)], [n(h, t), k(h, t)])

    return features


def _heads(r: Row) -> tuple[int, int]:
    """(heads per TP rank, head dim) of an attention-shaped row."""
    return _div(r["h"], r["mp"], "heads/mp"), _div(r["dim"], r["h"], "dim/heads")


def _baddbmm(r: Row) -> Features:
    hp, d = _heads(r)
    bh, seq = r["b"] * hp, r["l"]
    return shape_row("aten::baddbmm", [[bh, seq, seq], [bh, seq, d], [bh, d, seq]], [HALF, HALF, HALF])


def _bmm(r: Row) -> Features:
    hp, d = _heads(r)
    bh, seq = r["b"] * hp, r["l"]
    return shape_row("aten::bmm", [[bh, seq, seq], [bh, seq, d]], [HALF, HALF])


def _softmax(r: Row) -> Features:
    hp = _div(r["h"], r["mp"], "heads/mp")
    return shape_row("aten::_softmax", [[r["b"], hp, r["l"], r["l"]]], [HALF])


def _fillmask(r: Row) -> Features:
    scores = _baddbmm(r)
    out = _softmax(r)
    # masked_fill reads and writes the score tensor once more, like the softmax
    out["io_bytes"] = scores["io_bytes"] + 2 * out["io_bytes"]
    out["flops"] = scores["flops"]
    return out


def _scaled_upper_triang(r: Row) -> Features:
    hp = _div(r["h"], r["mp"], "heads/mp")
    out = shape_row("aten::_softmax", [[r["b"] * hp, r["l"], r["l"]]], [HALF])
    out["causal"] = True  # the upper triangle is masked
    return out


def _flash(r: Row) -> Features:
    hp, d = _heads(r)
    q = [r["b"], r["l"], hp, d]  # Dao flash_attn layout [batch, seq, heads, head_dim]
    out = shape_row("flash_attn::_flash_attn_forward", [q, q, q], [HALF, HALF, HALF])
    out["causal"] = False  # flash_attn_func was called without causal=True (by the published sampler)
    return out


def _gelu(r: Row) -> Features:
    return shape_row("aten::gelu", [[r["l"], r["b"], _div(4 * r["dim"], r["mp"], "4h/mp")]], [HALF])


def _norm(name: str) -> Callable[[Row], Features]:
    def features(r: Row) -> Features:
        return shape_row(name, [[r["b"], r["l"], r["dim"]], [r["dim"]]], [HALF, HALF])

    return features


def _res_add(r: Row) -> Features:
    x = [r["b"], r["l"], r["dim"]]
    return shape_row("aten::add", [x, x], [HALF, HALF])


def _rope(r: Row) -> Features:
    hp, d = _heads(r)
    return shape_row("aten::mul", [[r["l"], r["b"], hp, d]], [HALF])


def _embedding(r: Row) -> Features:
    vocab = padded_vocab_per_rank(r["mp"])
    return shape_row("aten::embedding", [[vocab, r["dim"]], [r["b"], r["l"]]], [HALF, LONG])


def _cross_entropy(r: Row) -> Features:
    vocab = padded_vocab_per_rank(r["mp"])
    return shape_row("vocab_parallel_cross_entropy", [[r["l"], r["b"], vocab], [r["l"], r["b"]]], [HALF, LONG])


def _encoder_tensors(h: int, t: int) -> list[list[int]]:
    """Parameter tensors of one toy encoder of the published sampler's stage: LayerNorm, Linear h→3h/t,
    Linear h/t→h, LayerNorm, Linear h→4h/t, Linear 4h/t→h, every Linear with a bias (12 tensors)."""
    ln = [[h], [h]]
    t3, t4, ht = _div(3 * h, t, "3h/mp"), _div(4 * h, t, "4h/mp"), _div(h, t, "dim/mp")
    return [*ln, [t3, h], [t3], [h, ht], [h], *ln, [t4, h], [t4], [h, t4], [h]]


def stage_tensors(t: int, h: int, layers: int, *, first: bool, last: bool) -> list[list[int]]:
    """Parameter tensor shapes of a toy pipeline stage, in the order the optimizer receives them:
    the vocab-parallel embedding (first stage), ``layers`` encoders, and a final LayerNorm and the
    vocab projection without bias (last stage)."""
    vocab = padded_vocab_per_rank(t)
    tensors = [[vocab, h]] if first else []
    tensors += layers * _encoder_tensors(h, t)
    if last:
        tensors += [[h], [h], [vocab, h]]
    return tensors


def _stage_optimizer(first: bool, last: bool) -> Callable[[Row], Features]:
    def features(r: Row) -> Features:
        tensors = stage_tensors(r["mp"], r["dim"], r["encoders"], first=first, last=last)
        # FusedAdam.step over the stage's parameters, recorded like a traced _fused_adam_ call
        return shape_row("aten::_fused_adam_", [tensors], ["TensorList"])

    return features


def _legacy_optimizer(r: Row) -> Features:
    # only totals are known: one flat tensor of ``params``, then the file's tensor count and width
    out = shape_row("aten::_fused_adam_", [[[r["params"]]]], ["TensorList"])
    out["batch"], out["hidden"] = r["param_tensors"], r["hidden_size"]
    return out


_ATTN = ("mp", "b", "h", "l", "dim")
_TP_GEMM = ("mp", "b", "l", "dim")

COMPUTE_OPS: dict[str, OpSpec] = {
    "linear1": OpSpec(_TP_GEMM, "gemm", _linear(lambda h, t: h, lambda h, t: _div(3 * h, t, "3h/mp"))),
    "linear2": OpSpec(_TP_GEMM, "gemm", _linear(lambda h, t: _div(h, t, "h/mp"), lambda h, t: h)),
    "linear3": OpSpec(_TP_GEMM, "gemm", _linear(lambda h, t: h, lambda h, t: _div(4 * h, t, "4h/mp"))),
    "linear4": OpSpec(_TP_GEMM, "gemm", _linear(lambda h, t: _div(4 * h, t, "4h/mp"), lambda h, t: h)),
    "linear_final": OpSpec(_TP_GEMM, "gemm", _linear(lambda h, t: h, lambda h, t: padded_vocab_per_rank(t))),
    "baddbmm": OpSpec(_ATTN, "gemm", _baddbmm),
    "bmm": OpSpec(_ATTN, "gemm", _bmm),
    "softmax": OpSpec(("mp", "b", "h", "l"), "softmax", _softmax),
    "fillmask": OpSpec(_ATTN, "softmax", _fillmask),
    "ScaledUpperTriangMaskedSoftmax": OpSpec(("mp", "b", "h", "l"), "softmax", _scaled_upper_triang),
    "flash_atten": OpSpec(_ATTN, "attention", _flash),
    "gelu": OpSpec(_TP_GEMM, "elementwise", _gelu),
    "res_add": OpSpec(("b", "l", "dim"), "elementwise", _res_add, tp_column=False),
    "RoPE": OpSpec(_ATTN, "elementwise", _rope),
    "layernorm": OpSpec(("b", "l", "dim"), "norm", _norm("aten::layer_norm"), tp_column=False),
    "RMSlayernorm": OpSpec(("b", "l", "dim"), "norm", _norm("aten::rms_norm"), tp_column=False),
    "embedding": OpSpec(_TP_GEMM, "embedding", _embedding),
    "parallel_cross_entropy_128": OpSpec(("mp", "b", "l"), "loss", _cross_entropy),
    "firstStage_optimizer": OpSpec(("mp", "dim", "encoders"), "optimizer", _stage_optimizer(True, False)),
    "middleStage_optimizer": OpSpec(("mp", "dim", "encoders"), "optimizer", _stage_optimizer(False, False)),
    "lastStage_optimizer": OpSpec(("mp", "dim", "encoders"), "optimizer", _stage_optimizer(False, True)),
    "optimizer": OpSpec(
        ("num_layers", "hidden_size", "param_tensors", "params"), "optimizer", _legacy_optimizer, tp_column=False
    ),
}
"""Every published compute op, by the op part of its file name."""

COLLECTIVES: dict[str, str] = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "broadcast": "broadcast",
    "p2p": "send",  # rank 0 sends to the last rank; the timed op is c10d::send (as published)
}
"""Published NCCL op stems (before an optional ``_large``) -> our normalised collective name."""

NCCL_COLUMNS = ("shape", "nodes", "GPUsPerNode")


def collective_of(op: str) -> str | None:
    """Our collective name for a published NCCL op (``allreduce_large`` -> ``all_reduce``), else None."""
    return COLLECTIVES.get(op.removesuffix("_large"))


def nccl_size_bytes(collective: str, elements: int, group_size: int) -> int:
    """nccl-tests ``S`` of a published row: ``shape`` fp16 elements (2 bytes) per rank; the gathered
    total for all_gather (every rank contributes ``shape`` elements)."""
    per_rank = 2 * elements
    return per_rank * group_size if collective == "all_gather" else per_rank

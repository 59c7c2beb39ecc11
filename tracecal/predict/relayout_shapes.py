"""Operator shapes of one layout re-derived for another tensor-parallel size and micro-batch size (pure).

A recorded ``Input Dims`` list is rewritten dimension by dimension, from the model's sizes (hidden
``h``, heads ``a``, sequence ``l``, FFN width, padded vocabulary) and the two layouts:

* **tensor parallel** (Megatron's column/row-parallel linears and heads): a dimension equal to
  ``Q / t`` for a split quantity ``Q`` (``3h``, the FFN width, ``h``, ``a``, ``b·a``, the padded
  vocabulary) becomes ``Q' / t'``. A GEMM splits exactly one of its dimensions (n of a column-parallel
  linear, k of a row-parallel one, m of a weight gradient, the batch of an attention GEMM). When a
  value is both a split size and an unsplit one (``4h / 4 = h``), a GEMM still splits exactly one:
  the one that is unambiguously split if there is one, else n, k, m in that order (either choice
  has the same flops); other operators keep the unsplit reading;
* **attention** (``scaled_dot_product_attention`` and its backward): a 4-D tensor is
  ``[b, a/t, l, d]``: axis 1 is the heads and axis 0 the micro-batch, whatever else the values equal;
* **micro-batch size** (the token dimension): ``b·l`` becomes ``b'·l``, and ``b`` beside ``l`` in the
  same tensor becomes ``b'``.

``work_ratio`` is the ratio of new to old work of a rewritten operator (flops of a GEMM, elements
otherwise), the rule for a duration no model predicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from math import ceil, prod

ATTENTION_OP = "scaled_dot_product"
"""Operators (forward and backward) whose 4-D tensors are ``[batch, heads, seq, head_dim]``."""

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
"""Operators whose dimensions are GEMM roles (m, k, n, batch)."""


@dataclass(frozen=True)
class ModelDims:
    """The model sizes a re-layout needs (from the run's log), at one layout's tp and micro-batch size.

    ``vocab_padded``: the padded vocabulary of the whole model at ``tp`` (``vocab_per_rank · tp``);
    ``vocab_multiple``: the framework pads it to a multiple of ``vocab_multiple · tp``."""

    hidden: int
    heads: int
    seq: int
    ffn: int
    vocab_padded: int | None
    vocab_multiple: int
    tp: int
    micro_batch_size: int
    replicated: tuple[int, ...] = ()
    """Sizes every tensor-parallel rank holds whole besides ``h`` and the tokens (a vocabulary that is
    not split, the micro-batch size): a split size equal to one of them is ambiguous."""

    def at(self, tp: int, micro_batch_size: int) -> ModelDims:
        """The same model at another tensor-parallel size and micro-batch size (vocabulary re-padded)."""
        vocab = self.vocab_padded
        if vocab is not None:
            step = self.vocab_multiple * tp
            vocab = ceil(vocab / step) * step
        return ModelDims(
            self.hidden,
            self.heads,
            self.seq,
            self.ffn,
            vocab,
            self.vocab_multiple,
            tp,
            micro_batch_size,
            self.replicated,
        )

    def split_sizes(self) -> dict[str, int | None]:
        """Per split quantity, its size on one tensor-parallel rank (None where it does not divide)."""
        b, t = self.micro_batch_size, self.tp
        whole = {
            "qkv": 3 * self.hidden,
            "ffn": self.ffn,
            "hidden": self.hidden,
            "heads": self.heads,
            "batch_heads": b * self.heads,
            "vocab": self.vocab_padded,
        }
        return {k: (v // t if v is not None and v % t == 0 else None) for k, v in whole.items()}

    def unsplit_sizes(self) -> set[int]:
        """Sizes that occur unsplit on a tensor-parallel rank (the ambiguity set of ``split_sizes``)."""
        return {self.hidden, self.seq, self.micro_batch_size * self.seq, *self.replicated}


@dataclass(frozen=True)
class ShapeMap:
    """How every dimension value of the source layout maps to the target's."""

    split: dict[int, int]
    """Split-size value -> its new value."""
    ambiguous: frozenset[int]
    """Values that are a split size and an unsplit size at once."""
    tokens: dict[int, int]
    """``b·l`` -> ``b'·l``."""
    batch: tuple[int, int, int]
    """(b, b', l): ``b`` beside ``l`` becomes ``b'``."""

    @property
    def identity(self) -> bool:
        return (
            all(k == v for k, v in self.split.items())
            and all(k == v for k, v in self.tokens.items())
            and self.batch[0] == self.batch[1]
        )


def shape_map(source: ModelDims, target: ModelDims) -> ShapeMap:
    """The dimension map from ``source`` to ``target`` (same model, other tp and micro-batch size)."""
    old, new = source.split_sizes(), target.split_sizes()
    split: dict[int, int] = {}
    for key, value in old.items():
        if value is not None and new[key] is not None and value not in split:
            split[value] = int(new[key] or 0)
    ambiguous = frozenset(v for v in split if v in source.unsplit_sizes())
    b, b2, seq = source.micro_batch_size, target.micro_batch_size, source.seq
    return ShapeMap(split, ambiguous, {b * seq: b2 * seq}, (b, b2, seq))


def _gemm_roles(op: str, dims: list) -> dict[str, list[tuple[int, int]]] | None:
    """Positions ``(tensor, axis)`` of each GEMM role (m, k, n, batch) in an operator's dims, or None
    when the dims are not those of the operator's GEMM."""
    shapes = [d for d in dims if isinstance(d, list)]

    def rank(i: int) -> int:
        return len(dims[i]) if i < len(dims) and isinstance(dims[i], list) else -1

    roles: dict[str, list[tuple[int, int]]] = {"m": [], "k": [], "n": [], "batch": []}
    if op == "aten::mm" and rank(0) == 2 and rank(1) == 2:
        roles.update(m=[(0, 0)], k=[(0, 1), (1, 0)], n=[(1, 1)])
    elif op == "aten::addmm" and rank(1) == 2 and rank(2) == 2:
        roles.update(m=[(1, 0)], k=[(1, 1), (2, 0)], n=[(2, 1), (0, rank(0) - 1)] if rank(0) >= 1 else [(2, 1)])
        if rank(0) == 2:
            roles["m"].append((0, 0))
    elif op in ("aten::bmm", "aten::matmul") and rank(0) == 3 and rank(1) == 3:
        roles.update(batch=[(0, 0), (1, 0)], m=[(0, 1)], k=[(0, 2), (1, 1)], n=[(1, 2)])
    elif op == "aten::baddbmm" and rank(0) == 3 and rank(1) == 3 and rank(2) == 3:
        roles.update(batch=[(0, 0), (1, 0), (2, 0)], m=[(0, 1), (1, 1)], k=[(1, 2), (2, 1)], n=[(0, 2), (2, 2)])
    elif op == "aten::matmul" and rank(0) >= 2 and rank(1) == 2:
        last = rank(0) - 1
        roles.update(m=[(0, i) for i in range(last)], k=[(0, last), (1, 0)], n=[(1, 1)])
    elif op == "aten::linear" and rank(0) >= 1 and rank(1) == 2:
        last = rank(0) - 1
        roles.update(m=[(0, i) for i in range(last)], k=[(0, last), (1, 1)], n=[(1, 0)])
        if rank(2) == 1:
            roles["n"].append((2, 0))
    else:
        return None
    return roles if shapes else None


def _token(value: int, tensor: list, axis: int, m: ShapeMap) -> int:
    """The new value of an unsplit dimension: the token dimension follows the micro-batch size."""
    if value in m.tokens:
        return m.tokens[value]
    b, b2, seq = m.batch
    if value == b and b != b2:
        neighbours = [tensor[i] for i in (axis - 1, axis + 1) if 0 <= i < len(tensor)]
        if seq in neighbours:
            return b2
    return value


AMBIGUOUS_ORDER = ("n", "k", "m")
"""The GEMM role that splits when several are ambiguous and none is sure (the same flops either way)."""


def rewrite_dims(op: str | None, dims: list, m: ShapeMap, prefer: tuple[str, ...] = AMBIGUOUS_ORDER) -> list:
    """``dims`` (an ``Input Dims`` list) of operator ``op`` at the target layout; ``prefer``: the order
    of ``AMBIGUOUS_ORDER`` when the caller knows the GEMM's parallel role (a row-parallel linear splits k)."""
    out = [list(d) if isinstance(d, list) else d for d in dims]
    roles = _gemm_roles(op or "", dims) if op in GEMM_OPS else None
    fixed: set[tuple[int, int]] = set()
    if roles is not None:
        value = {r: dims[p[0][0]][p[0][1]] for r, p in roles.items() if p}
        sure = [r for r, v in value.items() if v in m.split and v not in m.ambiguous]
        maybe = [r for r in prefer if value.get(r) in m.ambiguous]
        chosen = sure or maybe[:1]
        for role, positions in roles.items():
            for t, a in positions:
                v = dims[t][a]
                out[t][a] = m.split[v] if role in chosen else _token(v, dims[t], a, m)
                fixed.add((t, a))
    if op and ATTENTION_OP in op:
        # heads are axis 1 of a 4-D attention tensor, whatever else their value could be
        for t, tensor in enumerate(dims):
            if isinstance(tensor, list) and len(tensor) == 4 and tensor[1] in m.split:
                out[t][1] = m.split[tensor[1]]
                out[t][0] = m.batch[1] if tensor[0] == m.batch[0] else tensor[0]
                fixed.update((t, a) for a in range(4))
    for t, tensor in enumerate(dims):
        if not isinstance(tensor, list):
            continue
        for a, v in enumerate(tensor):
            if (t, a) in fixed or not isinstance(v, int):
                continue
            if v in m.split and v not in m.ambiguous:
                out[t][a] = m.split[v]
            else:
                out[t][a] = _token(v, tensor, a, m)
    return out


def rewrite_dims_text(op: str | None, text: str | None, m: ShapeMap) -> str | None:
    """``rewrite_dims`` on the JSON text of ``Input Dims`` (text that is not a list is kept)."""
    if not text or m.identity:
        return text
    try:
        dims = json.loads(text)
    except ValueError:
        return text
    if not isinstance(dims, list):
        return text
    return json.dumps(rewrite_dims(op, dims, m))


def work(op: str | None, dims: list) -> float | None:
    """An operator's work: flops/2 of a GEMM (m·n·k·batch), else the elements of its tensors."""
    roles = _gemm_roles(op or "", dims) if op in GEMM_OPS else None
    if roles is not None:
        size = {r: dims[p[0][0]][p[0][1]] for r, p in roles.items() if p}
        return float(size.get("m", 1) * size.get("n", 1) * size.get("k", 1) * size.get("batch", 1))
    tensors = [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    return float(sum(prod(d) for d in tensors)) if tensors else None


def work_ratio(op: str | None, old: str | None, new: str | None) -> float:
    """New over old work of an operator whose dims were rewritten (1 where either is unknown)."""
    if old is None or new is None or old == new:
        return 1.0
    try:
        a, b = work(op, json.loads(old)), work(op, json.loads(new))
    except (ValueError, TypeError):
        return 1.0
    return b / a if a and b is not None else 1.0

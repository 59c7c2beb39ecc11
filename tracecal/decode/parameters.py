"""The parameters an optimizer step updates, from the autograd engine's gradient accumulations.

A foreach optimizer's ``_foreach_*`` calls record their TensorLists without shapes, so a trace does not
say which parameters a step updated. The backward pass does: the autograd engine runs one
``torch::autograd::AccumulateGrad`` per parameter that receives a gradient, recording the parameter's
shape and dtype, and those are the parameters ``optimizer.step()`` updates.

An iteration of several micro-batches accumulates into every parameter once per backward pass, in
the same order, so the sequence of accumulated shapes repeats; one period of it is the parameter
list. ``parameter_groups(rows)`` is pure: rows of ``sql/queries/run_parameters.sql``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from tracecal.decode.shape_features import normalize_dtype


@dataclass(frozen=True)
class StepParameters:
    """The parameters one rank's optimizer step updates: elements, tensors, and the dtype most of
    the elements have."""

    params: int
    tensors: int
    dtype: str | None


def _json(value: Any) -> Any:
    if value is None or isinstance(value, list):
        return value or []
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return []


def parameter_groups(rows: Iterable[dict[str, Any]]) -> dict[int, StepParameters]:
    """Per rank, the parameters its optimizer steps: one backward pass's accumulations (the shortest
    period that repeats evenly through the rank's sequence of accumulated shapes).

    Args:
        rows: (rank, input_dims, input_types) of the ``AccumulateGrad`` calls, in order per rank.
    """
    per_rank: dict[int, list[tuple[tuple[int, ...], str | None]]] = {}
    for r in rows:
        dims, types = _json(r["input_dims"]), _json(r["input_types"])
        shape = dims[0] if dims and isinstance(dims[0], list) and all(isinstance(d, int) for d in dims[0]) else None
        if shape is None:
            continue
        dtype = normalize_dtype(types[0]) if types and isinstance(types[0], str) else None
        per_rank.setdefault(int(r["rank"]), []).append((tuple(shape), dtype))
    out = {}
    for rank, seq in per_rank.items():
        n = len(seq)
        period = next(p for p in range(1, n + 1) if n % p == 0 and all(seq[i] == seq[i % p] for i in range(n)))
        one_pass = seq[:period]
        elements: Counter[str | None] = Counter()
        for tensor_shape, dtype in one_pass:
            elements[dtype] += math.prod(tensor_shape)
        out[rank] = StepParameters(sum(math.prod(s) for s, _ in one_pass), period, elements.most_common(1)[0][0])
    return out

"""Parallel layouts a model can run at: parsing ``PPxTPxDP``, the framework's layer partition, and the
checks that make a layout valid for a model (pure).

A layout is invalid when the model cannot be split that way: attention heads (or the hidden size)
not divisible by the tensor-parallel size, fewer transformer layers than pipeline stages, a world
size that is not the GPUs asked for or does not fill whole nodes. Each reason is one line naming
the numbers (``LayoutError``).

**Layer partition.** DeepSpeed's pipeline module cuts the model's layer list into contiguous stages.
The rule is taken from the run's own log (its ``stage=N layers=M`` listing): ``uniform`` (DeepSpeed's
``partition_uniform`` over every layer, the first ``n mod p`` stages one layer more) or
``transformer`` (the transformer layers spread the same way, the other layers kept beside the first
and last of them), whichever reproduces the listing (see ``docs/what-if.md``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tracecal.errors import PredictionError


class LayoutError(PredictionError):
    """A requested parallel layout is malformed or the model cannot run at it."""


_LAYOUT = re.compile(r"^\s*(\d+)\s*[x×*·]\s*(\d+)\s*[x×*·]\s*(\d+)\s*$")


@dataclass(frozen=True)
class Layout:
    """A parallel layout and the batch each data-parallel rank runs (None: as the source run)."""

    pp: int
    tp: int
    dp: int
    micro_batches: int | None = None
    micro_batch_size: int | None = None
    gpus_per_node: int | None = None

    @property
    def world_size(self) -> int:
        return self.pp * self.tp * self.dp

    @property
    def text(self) -> str:
        return f"{self.pp}x{self.tp}x{self.dp}"


def parse_layout(text: str) -> tuple[int, int, int]:
    """``"4x8x4"`` -> ``(4, 8, 4)`` (PP, TP, DP).

    Raises:
        LayoutError: not three positive integers joined by ``x``.
    """
    m = _LAYOUT.match(text or "")
    if m is None or min(int(g) for g in m.groups()) < 1:
        raise LayoutError(f"--layout {text!r}: expected PPxTPxDP with positive integers, e.g. 4x8x4")
    pp, tp, dp = (int(g) for g in m.groups())
    return pp, tp, dp


TRANSFORMER_LAYER = "TransformerLayer"
"""A layer class whose name contains this is a transformer layer (as the log's listing names it)."""


def partition_uniform(items: int, parts: int) -> list[int]:
    """Items per part: ``items // parts`` each, the first ``items mod parts`` parts one more."""
    base, extra = divmod(items, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _cut(layers: list[str], counts: list[int]) -> list[list[str]]:
    out, at = [], 0
    for n in counts:
        out.append(layers[at : at + n])
        at += n
    return out


def partition(layers: list[str], stages: int, rule: str) -> list[list[str]]:
    """The model's layer classes (in order) cut into ``stages`` contiguous stages by ``rule``."""
    if rule == "uniform":
        return _cut(layers, partition_uniform(len(layers), stages))
    is_t = [TRANSFORMER_LAYER in name for name in layers]
    first = is_t.index(True) if any(is_t) else 0
    last = len(is_t) - 1 - is_t[::-1].index(True) if any(is_t) else len(is_t) - 1
    per = partition_uniform(sum(is_t), stages)
    counts = [n for n in per]
    counts[0] += first
    counts[-1] += len(layers) - 1 - last
    return _cut(layers, counts)


PARTITION_RULES = ("uniform", "transformer")


def partition_rule(stage_layers: list[list[str]]) -> str | None:
    """The rule that reproduces a run's partition listing (None when neither does)."""
    layers = [name for stage in stage_layers for name in stage]
    for rule in PARTITION_RULES:
        if partition(layers, len(stage_layers), rule) == stage_layers:
            return rule
    return None


@dataclass(frozen=True)
class ModelFacts:
    """What the validity checks need from the model."""

    layers: int
    heads: int
    hidden: int
    ffn: int


def check_layout(model: ModelFacts, layout: Layout, *, gpus: int | None = None, min_stages: int = 1) -> None:
    """Raise ``LayoutError`` with the first reason ``layout`` cannot run ``model``.

    ``gpus``: the GPUs the layout must use (``tracecal search --gpus``); ``min_stages``: the fewest
    pipeline stages the framework's rebuild supports."""
    if gpus is not None and layout.world_size != gpus:
        raise LayoutError(f"layout {layout.text} uses {layout.world_size} GPUs (PP·TP·DP), not the {gpus} asked for")
    gpn = layout.gpus_per_node
    if gpn is not None and layout.world_size > gpn and layout.world_size % gpn:
        raise LayoutError(
            f"layout {layout.text}: world size {layout.world_size} does not fill whole nodes of {gpn} GPUs"
        )
    if model.heads % layout.tp:
        raise LayoutError(
            f"layout {layout.text}: {model.heads} attention heads are not divisible by tensor parallel {layout.tp}"
        )
    if model.hidden % layout.tp or model.ffn % layout.tp:
        raise LayoutError(
            f"layout {layout.text}: hidden size {model.hidden} (FFN {model.ffn}) is not divisible by "
            f"tensor parallel {layout.tp}"
        )
    if layout.pp > model.layers:
        raise LayoutError(
            f"layout {layout.text}: {model.layers} transformer layers cannot fill {layout.pp} pipeline stages"
        )
    if layout.pp < min_stages:
        raise LayoutError(
            f"layout {layout.text}: this run can be rebuilt with {min_stages} or more pipeline stages "
            f"(its framework's schedule needs a head and a tail stage)"
        )
    for name, value in (("micro-batches", layout.micro_batches), ("micro-batch size", layout.micro_batch_size)):
        if value is not None and value < 1:
            raise LayoutError(f"layout {layout.text}: {name} {value} must be at least 1")

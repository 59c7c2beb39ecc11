"""Which layouts of N GPUs a run's model can use, and how fast each is predicted to train (pure apart
from ``predict_layout``).

Candidates are every PP·TP·DP = N. A candidate is kept when the model divides (``layouts.check_layout``:
heads and hidden size by TP, transformer layers over PP, whole nodes) and its estimated memory per
GPU fits the device (``memory_per_gpu``). Each kept layout is rebuilt and replayed
(``relayout_run.predict_layout``) at the source run's micro-batches and micro-batch size per
data-parallel rank (or the ones given), so its global batch is DP · micro-batches · size; layouts are
ranked by samples per second.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from tracecal.errors import PredictionError, TracecalError
from tracecal.predict.layouts import Layout, LayoutError, ModelFacts, check_layout
from tracecal.predict.relayout_shapes import ModelDims
from tracecal.sources.registry import relayout_formats

if TYPE_CHECKING:
    from tracecal.predict.relayout_run import ScratchDatabase

FP16_BYTES = 2
ZERO1_OPTIMIZER_BYTES = 12
"""fp32 master weights, Adam's two moments per parameter, partitioned over data parallel (ZeRO-1)."""
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 34
"""Bytes per token and hidden unit of one transformer layer's activations during its recompute
(Korthikanti et al., "Reducing Activation Recomputation", without sequence parallelism), plus the
attention scores ``5·a·l`` per token and head group."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(gpus: int) -> list[Layout]:
    """Every PP × TP × DP = ``gpus``, PP and TP ascending."""
    return [Layout(pp, tp, gpus // (pp * tp)) for pp in divisors(gpus) for tp in divisors(gpus // pp)]


def memory_per_gpu(dims: ModelDims, facts: ModelFacts, layout: Layout, first_stage_layers: int) -> float:
    """Estimated bytes per GPU of the first pipeline stage (the one holding most in-flight
    micro-batches): fp16 weights and gradients, the ZeRO-1 optimizer state share, the checkpointed
    layer inputs of ``PP`` micro-batches in flight, and one layer's full activations for its recompute."""
    h, t = dims.hidden, layout.tp
    b, seq = int(layout.micro_batch_size or dims.micro_batch_size), dims.seq
    per_layer = (4 * h * h + 2 * h * dims.ffn) / t
    params = first_stage_layers * per_layer + (dims.vocab_padded or 0) * h / t
    state = params * (2 * FP16_BYTES + ZERO1_OPTIMIZER_BYTES / layout.dp)
    checkpoints = layout.pp * first_stage_layers * seq * b * h * FP16_BYTES
    recompute = seq * b * h * ACTIVATION_BYTES_PER_TOKEN_HIDDEN / t + 5 * dims.heads * seq * seq * b / t
    return state + checkpoints + recompute


@dataclass(frozen=True)
class Rejected:
    layout: Layout
    reason: str


def valid_layouts(
    gpus: int,
    facts: ModelFacts,
    dims: ModelDims,
    base: Layout,
    *,
    stage_layers: Callable[[Layout], int],
    memory_bytes: float | None,
    min_stages: int = 2,
) -> tuple[list[Layout], list[Rejected]]:
    """The layouts of ``gpus`` GPUs the model can run at and those it cannot (with the reason).

    ``base`` carries micro-batches, their size and GPUs per node; ``stage_layers(layout)`` the
    transformer layers of the first stage under the framework's partition (raises ``LayoutError``
    when a stage would have none); ``memory_bytes`` the device memory (None: not checked)."""
    kept, rejected = [], []
    for c in candidates(gpus):
        layout = replace(base, pp=c.pp, tp=c.tp, dp=c.dp)
        try:
            check_layout(facts, layout, gpus=gpus, min_stages=min_stages)
            first = stage_layers(layout)
            if memory_bytes is not None:
                need = memory_per_gpu(dims, facts, layout, first)
                if need > memory_bytes:
                    raise LayoutError(
                        f"layout {layout.text}: about {need / 2**30:.0f} GiB per GPU, more than the "
                        f"{memory_bytes / 2**30:.0f} GiB of the device"
                    )
        except LayoutError as exc:
            rejected.append(Rejected(layout, str(exc)))
            continue
        kept.append(layout)
    return kept, rejected


SEARCH_SCHEMA = {
    "layout": pl.String,
    "pp": pl.Int64,
    "tp": pl.Int64,
    "dp": pl.Int64,
    "micro_batches": pl.Int64,
    "micro_batch_size": pl.Int64,
    "global_batch": pl.Int64,
    "iteration_ms": pl.Float64,
    "samples_per_s": pl.Float64,
    "idle_share": pl.Float64,
    "gap_share": pl.Float64,
    "uncovered_share": pl.Float64,
}
"""One row per searched layout (component shares are added as ``<component>_share`` columns)."""


def ranking(results: list) -> pl.DataFrame:
    """``LayoutPrediction``s as rows, fastest throughput first, with each component's share."""
    rows = []
    for r in results:
        row = {
            "layout": r.layout.text,
            "pp": r.layout.pp,
            "tp": r.layout.tp,
            "dp": r.layout.dp,
            "micro_batches": r.layout.micro_batches,
            "micro_batch_size": r.layout.micro_batch_size,
            "global_batch": r.samples,
            "iteration_ms": r.iteration_ns / 1e6,
            "samples_per_s": r.throughput,
            "idle_share": r.idle_share,
            "gap_share": r.gap_share,
            "uncovered_share": float(r.uncovered["share"].sum()) if r.uncovered.height else 0.0,
        }
        for comp, share in zip(r.components["component"], r.components["share"], strict=True):
            row[f"{comp}_share"] = share
        rows.append(row)
    if not rows:
        return pl.DataFrame(schema=SEARCH_SCHEMA)
    frame = pl.DataFrame(rows, schema_overrides=SEARCH_SCHEMA)
    return frame.sort("samples_per_s", descending=True).with_row_index("rank", offset=1)


_DEVICE_MEMORY = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def device_memory_bytes(con, cluster: str | None) -> tuple[float | None, str]:
    """The device memory of a cluster's GPUs as its samples name them (``...-80GB``), and where from."""
    if cluster is None:
        return None, "no --cluster: memory per GPU not checked"
    names = [r[0] for r in con.execute(
        "SELECT DISTINCT device_name FROM samples WHERE cluster = ? AND device_name IS NOT NULL", [cluster]
    ).fetchall()]  # fmt: skip
    sizes = [int(m.group(1)) for n in names if (m := _DEVICE_MEMORY.search(n))]
    if not sizes:
        return None, f"{cluster}'s samples name no device memory: memory per GPU not checked (use --gpu-memory-gib)"
    return min(sizes) * 1e9, f"{min(sizes)} GB, from the device of {cluster}'s samples"


class SearchError(TracecalError):
    """No layout of the GPUs asked for can run the model."""


@dataclass(frozen=True)
class SearchResult:
    """A search: the ranking, each layout's prediction, the layouts left out and why."""

    gpus: int
    table: pl.DataFrame
    predictions: list
    rejected: list[Rejected]
    memory_bytes: float | None


def search_run(
    con,
    run_id: str,
    gpus: int,
    *,
    scratch: ScratchDatabase,
    model=None,
    mode: str = "predicted",
    gpus_per_node: int | None = None,
    micro_batches: int | None = None,
    micro_batch_size: int | None = None,
    memory_bytes: float | None = None,
    progress: Callable[[Layout, int, int], None] | None = None,
) -> SearchResult:
    """Predict every valid layout of ``gpus`` GPUs for the model of ``run_id`` and rank them (each
    replayed in a fresh ``scratch`` database, ``relayout_run.predict_layout``).

    Raises:
        SearchError: no layout is valid (the reasons of each named). RunNotFoundError,
        PredictionError: see ``relayout_run.rebuilder``; a run of the reference workload is predicted at
        one layout at a time (``predict --layout``).
    """
    from tracecal.predict.relayout_run import predict_layout, rebuilder

    run = rebuilder(con, run_id)
    if isinstance(run, Path):
        raise PredictionError(
            f"run {run_id} is a run of the reference workload: search ranks the layouts of runs of "
            f"{', '.join(relayout_formats())}; predict it at one layout at a time with `tracecal predict {run_id} "
            "--layout PPxTPxDP`"
        )
    src = run.layout
    base = Layout(
        src.pp,
        src.tp,
        src.dp,
        micro_batches=micro_batches or src.micro_batches,
        micro_batch_size=micro_batch_size or src.micro_batch_size,
        gpus_per_node=gpus_per_node or src.gpus_per_node,
    )
    kept, rejected = valid_layouts(
        gpus, run.facts, run.dims, base, stage_layers=run.first_stage_layers, memory_bytes=memory_bytes
    )
    if not kept:
        reasons = "; ".join(r.reason for r in rejected[:4])
        raise SearchError(f"no layout of {gpus} GPUs can run {run_id}'s model: {reasons}")
    results = []
    for i, layout in enumerate(kept):
        if progress is not None:
            progress(layout, i, len(kept))
        results.append(predict_layout(con, run_id, layout, scratch=scratch, mode=mode, model=model, gpus=gpus))
    return SearchResult(gpus, ranking(results), results, rejected, memory_bytes)

"""A decoded GPT-NeoX run rebuilt at another parallel layout: the GPUModeling25 source's relayout
capability (``Source.relayout``, ``open_relayout``), pure apart from reading the run folder.

The run's kernel tables (head, a middle stage, tail) are the model's operators at the traced layout.
For a target layout ``PP'×TP'×DP'`` (and micro-batch count and size) they are re-derived, not scaled:

* **layers per stage** follow the framework's partition rule, the one that reproduces the log's
  listing (``layouts.partition_rule``); the head keeps the embedding, the tail the final norm, the
  output layer and the loss; a stage table gets transformer-layer blocks removed or repeated;
* **shapes** (``relayout_shapes``): the tensor-parallel split of GEMM dimensions, heads and the
  vocabulary, and the token dimension of the micro-batch size, rewritten in every operator's Input
  Dims; tensor-parallel all-reduces follow their message (``[l, b, h]``) and their group (TP' ranks);
* **data parallel**: the stage's gradient elements (per transformer layer and the stage's extras,
  from the traced all-reduce buckets) at TP' are cut into buckets of the log's ``reduce_bucket_size``;
  the ZeRO-1 partitions (all-gather messages, fp32 partition copies) are the stage's parameters over
  DP'; groups follow the layout;
* **pipeline**: the stages, their point-to-point pairs and DeepSpeed's 1F1B schedule over the
  micro-batches are those of ``reconstruct`` at the target layout.

Durations: a row whose shape changed keeps its traced duration times the work ratio
(``relayout_shapes.work_ratio``) until a model predicts it; a kernel without a recorded shape inside
a transformer layer is taken to split like the layer (× TP/TP' × b'/b), and one in the optimizer step
like the ZeRO partition. CPU-side gaps stay as traced, per kernel position (the true mean gap before
it). Everything is documented in ``docs/what-if.md``.

It uses ``tracecal.predict``'s layout rules and shape maps, so it sits above predict (with ``validate``
and ``samples``); predict reaches it through the registry only (``predict.relayout_run``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from tracecal.decode.consistency import misaligned_ops
from tracecal.errors import PredictionError
from tracecal.predict.layouts import (
    TRANSFORMER_LAYER,
    Layout,
    LayoutError,
    ModelFacts,
    check_layout,
    partition,
    partition_rule,
)
from tracecal.predict.relayout_shapes import ModelDims, ShapeMap, rewrite_dims_text, shape_map, work_ratio
from tracecal.predict.relayout_source import RebuiltLayout
from tracecal.sources.gpumodeling25.read.decoded_run import POSITIONS, DecodedRun, occurrences, read_decoded_run
from tracecal.sources.gpumodeling25.read.neox_log import NeoxLog, parse_neox_log
from tracecal.sources.gpumodeling25.read.tables import NEOX_LOG_KEY
from tracecal.sources.gpumodeling25.rebuild.load import as_folder_run
from tracecal.sources.gpumodeling25.rebuild.reconstruct import (
    LAYER_FUNCTIONS,
    SMALL_ALLREDUCE_ELEMENTS,
    MisalignedFn,
    RebuiltRun,
    RunShape,
    layer_blocks,
    reconstruct,
)
from tracecal.vocabulary import ParallelLayout

_SPAN = {"fwd": "stage_fwd", "bwd": "stage_bwd", "reduce_grads": "dp_allreduce", "optimizer_step": "optimizer"}
"""The run-level measured module whose mean span fixes each table's occurrence count (as ``reconstruct``)."""

VOCAB_MULTIPLE_DEFAULT = 128
"""GPT-NeoX's ``make_vocab_size_divisible_by`` when the log does not state it."""


def model_dims(log: NeoxLog, run: DecodedRun | None = None) -> ModelDims:
    """The model's sizes at the run's own layout, from its log (the padded vocabulary per rank from
    the head's embedding table, the one place it is recorded).

    Raises:
        PredictionError: the log lacks the hidden size, heads, sequence length or layers.
    """
    missing = log.unstated("hidden_size", "num_attention_heads", "seq_length", "num_layers")
    if missing:
        raise PredictionError(f"{log.source}: the log states no {', '.join(missing)}; cannot re-derive shapes")
    h = int(log.hidden_size or 0)
    ffn_arg = log.args.get("intermediate_size") if log.args else None
    ffn = int(ffn_arg) if ffn_arg and ffn_arg.strip().isdigit() else 4 * h
    multiple_arg = (log.args or {}).get("make_vocab_size_divisible_by")
    multiple = int(multiple_arg) if multiple_arg and multiple_arg.strip().isdigit() else VOCAB_MULTIPLE_DEFAULT
    tp = int(log.model_parallel_size or 1)
    vocab = None
    if run is not None:
        per_rank = _embedding_rows(run.tables["head"]["fwd"], h)
        vocab = per_rank * tp if per_rank else None
    return ModelDims(
        hidden=h,
        heads=int(log.num_attention_heads or 0),
        seq=int(log.seq_length or 0),
        ffn=ffn,
        vocab_padded=vocab,
        vocab_multiple=multiple,
        tp=tp,
        micro_batch_size=int(log.train_micro_batch_size_per_gpu or 1),
    )


def _embedding_rows(table: pl.DataFrame, hidden: int) -> int | None:
    """Rows of the vocabulary-parallel embedding weight (``[V/t, h]``) of a head table."""
    rows = table.filter(pl.col("outer_op").str.contains("embedding").fill_null(False))
    for text in rows["inner_dims"].drop_nulls().to_list():
        dims = json.loads(text) if text.startswith("[") else []
        for d in dims:
            if isinstance(d, list) and len(d) == 2 and d[1] == hidden and d[0] > hidden // 2:
                return int(d[0])
    return None


def model_facts(log: NeoxLog, dims: ModelDims) -> ModelFacts:
    return ModelFacts(layers=int(log.num_layers or 0), heads=dims.heads, hidden=dims.hidden, ffn=dims.ffn)


@dataclass(frozen=True)
class Relayout:
    """A decoded run's tables and log at the target layout, ready for ``reconstruct``."""

    run: DecodedRun
    log: NeoxLog
    layout: Layout
    source: Layout
    layers_per_stage: list[int]
    partition_rule: str
    notes: list[str] = field(default_factory=list)


def source_layout(log: NeoxLog) -> Layout:
    return Layout(
        pp=int(log.pipe_parallel_size or 1),
        tp=int(log.model_parallel_size or 1),
        dp=int(log.data_parallel_size or 1),
        micro_batches=int(log.gradient_accumulation_steps or 1),
        micro_batch_size=int(log.train_micro_batch_size_per_gpu or 1),
        gpus_per_node=log.gpus_per_node,
    )


def resolve(target: Layout, source: Layout) -> Layout:
    """``target`` with what it leaves open taken from the source run."""
    return replace(
        target,
        micro_batches=target.micro_batches or source.micro_batches,
        micro_batch_size=target.micro_batch_size or source.micro_batch_size,
        gpus_per_node=target.gpus_per_node or source.gpus_per_node,
    )


def relayout(run: DecodedRun, log: NeoxLog, target: Layout, *, gpus: int | None = None) -> Relayout:
    """The run's tables and log at ``target`` (the run itself when the layout is its own).

    Raises:
        LayoutError: the model cannot run at ``target``.
        PredictionError: the run lacks what a re-layout needs.
    """
    src = source_layout(log)
    target = resolve(target, src)
    dims = model_dims(log, run)
    check_layout(model_facts(log, dims), target, gpus=gpus, min_stages=2)
    rule = partition_rule(log.stage_layers)
    notes: list[str] = []
    if rule is None:
        rule = "uniform"
        notes.append("the log's partition listing follows no known rule; stages cut uniformly over the layers")
    all_layers = [name for stage in log.stage_layers for name in stage]
    stages = partition(all_layers, target.pp, rule)
    per_stage = [sum(TRANSFORMER_LAYER in n for n in s) for s in stages]
    if min(per_stage) < 1:
        raise LayoutError(
            f"layout {target.text}: the {rule} partition of {len(all_layers)} layers leaves a pipeline stage "
            f"without a transformer layer ({per_stage})"
        )
    if target == replace(src, gpus_per_node=target.gpus_per_node) and target.gpus_per_node == src.gpus_per_node:
        return Relayout(run, log, target, src, per_stage, rule, notes)
    if src.pp < 3 and target.pp > 2:
        raise PredictionError(
            f"layout {target.text}: the run traced no middle pipeline stage (PP {src.pp}); its tables "
            "cannot make the middle stages"
        )
    smap = shape_map(dims, dims.at(target.tp, int(target.micro_batch_size or 1)))
    iterations = len(log.profiled_iterations or [1])
    tables = {pos: dict(run.tables[pos]) for pos in POSITIONS}
    best = {pos: dict(run.best_batch.get(pos, {})) for pos in POSITIONS}
    avg = run.module_times.get("run_level_average", {})
    src_layers = log.transformer_layers_per_stage
    want = {"head": per_stage[0], "middle": per_stage[1] if target.pp > 2 else None, "tail": per_stage[-1]}
    have = {"head": src_layers[0], "middle": src_layers[1] if src.pp > 2 else None, "tail": src_layers[-1]}
    m_src, m_new = int(src.micro_batches or 1), int(target.micro_batches or 1)
    token_ratio = (target.micro_batch_size or 1) / (src.micro_batch_size or 1)
    layer_ratio = src.tp / target.tp * token_ratio
    grads = _stage_gradients(run, have)
    for pi, pos in enumerate(POSITIONS):
        if pos == "middle" and src.pp < 3:
            continue
        for name in ("fwd", "bwd", "reduce_grads", "optimizer_step"):
            per_src, per_new = (m_src, m_new) if name in ("fwd", "bwd") else (1, 1)
            span = avg.get(_SPAN[name])
            table = _true_gaps(run.tables[pos][name], span[pi] if span else None, per_src, per_new, iterations)
            if name in ("fwd", "bwd") and want[pos] is not None:
                table = _with_layer_count(table, name, int(want[pos] or 0))
            if name in ("fwd", "bwd"):
                table = _with_layer_messages(table, name)
            table = _reshaped(table, smap, layer_ratio if name in ("fwd", "bwd") else 1.0, name, token_ratio)
            tables[pos][name] = table
        send = best[pos].get("pp_p2p")
        if send is not None:
            span = avg.get("pp_p2p")
            # reconstruct counts a send table's occurrences per iteration (micro-batches only)
            best[pos]["pp_p2p"] = _reshaped(
                _true_gaps(send, span[pi] if span else None, m_src, m_new, 1), smap, 1.0, "pp_p2p", token_ratio
            )
    bucket = int(log.reduce_bucket_size or 0) or None
    for pos in POSITIONS:
        if pos == "middle" and src.pp < 3:
            continue
        new_elems = _target_gradients(grads, pos, int(want[pos] or 0), src.tp / target.tp)
        tables[pos]["reduce_grads"] = _rebucketed(tables[pos]["reduce_grads"], grads.buckets[pos], new_elems, bucket)
        ratio = new_elems / grads.total(pos) * src.dp / target.dp if grads.total(pos) else 1.0
        tables[pos]["optimizer_step"] = _repartitioned(tables[pos]["optimizer_step"], ratio)
    new_run = replace(run, tables=tables, best_batch=best, module_times={})
    new_log = _log_at(log, target, stages)
    notes.append(
        f"re-laid out {src.text} -> {target.text}: {per_stage} transformer layers per stage ({rule} partition), "
        f"{target.micro_batches} micro-batches of {target.micro_batch_size} per data-parallel rank"
    )
    return Relayout(new_run, new_log, target, src, per_stage, rule, notes)


def _true_gaps(table: pl.DataFrame, span_us: float | None, per_src: int, per_new: int, iterations: int) -> pl.DataFrame:
    """The table with ``overhead_us`` such that ``reconstruct``, counting ``per_new · iterations``
    occurrences and no measured span, finds the same true mean gap the traced run's occurrences give."""
    n = occurrences(table, span_us, per_src * iterations)
    factor = per_new * iterations / n
    return table.with_columns(pl.col("overhead_us") * factor)


def _with_layer_count(table: pl.DataFrame, name: str, target: int) -> pl.DataFrame:
    """``table`` with its last transformer-layer block repeated, or trailing blocks removed, to hold
    ``target`` layers (a table without recognised layers is kept)."""
    blocks = layer_blocks(table, name)
    if not blocks or len(blocks) == target:
        return table
    start, stop = blocks[-1]
    if target < len(blocks):
        cut = blocks[target][0]
        return pl.concat([table[:cut], table[stop:]])
    last = table[start:stop]
    # a repeated layer is another occurrence of the checkpoint function: its own External ids
    shift = int(table["outer_id"].fill_null(0).max() or 0) + 1  # type: ignore[arg-type]
    copies = [
        last.with_columns(pl.col("outer_id") + shift * (i + 1), pl.col("inner_id") + shift * (i + 1))
        for i in range(target - len(blocks))
    ]
    return pl.concat([table[:stop], *copies, table[stop:]])


_ALL_REDUCE_KERNEL = r"(?i)nccl\w*Kernel_AllReduce"
_SHAPED = r"^\[\[\d"
"""Input Dims whose first tensor has dimensions."""


def _with_layer_messages(table: pl.DataFrame, name: str) -> pl.DataFrame:
    """All-reduces of a transformer layer whose CPU operator recorded no message (``record_param_comms``
    without dims, a frame) take the layer's common all-reduce message, so the communication model
    predicts them at the new group and topology instead of keeping the traced time."""
    layer = pl.Series(_in_layers(table, name), dtype=pl.Boolean)
    all_reduce = pl.col("kernel").str.contains(_ALL_REDUCE_KERNEL)
    shaped = pl.col("inner_dims").str.contains(_SHAPED).fill_null(False)
    known = table.filter(layer & all_reduce & shaped)["inner_dims"]
    if known.len() == 0:
        return table
    common = known.mode().sort()[0]
    fill = layer & all_reduce & ~shaped
    return table.with_columns(
        pl.when(fill).then(pl.lit("nccl:all_reduce")).otherwise(pl.col("inner_op")).alias("inner_op"),
        pl.when(fill).then(pl.lit(common)).otherwise(pl.col("inner_dims")).alias("inner_dims"),
    )


def _reshaped(
    table: pl.DataFrame, smap: ShapeMap, unshaped_ratio: float, name: str, token_ratio: float = 1.0
) -> pl.DataFrame:
    """Every operator's dims at the target layout; durations times the work ratio (rows without a
    shape inside a transformer layer: ``unshaped_ratio``, collectives among them ``token_ratio``:
    a tensor-parallel message does not split)."""
    if smap.identity:
        return table
    ops, inner, outer = table["inner_op"].to_list(), table["inner_dims"].to_list(), table["outer_dims"].to_list()
    outer_ops = table["outer_op"].to_list()
    new_inner = [rewrite_dims_text(o, d, smap) for o, d in zip(ops, inner, strict=True)]
    new_outer = [rewrite_dims_text(o, d, smap) for o, d in zip(outer_ops, outer, strict=True)]
    in_layer = pl.Series(
        [False] * table.height if name not in ("fwd", "bwd") else _in_layers(table, name), dtype=pl.Boolean
    )
    # a row whose innermost operator is the layer's checkpoint frame records the layer's input, not
    # the kernel's shape: it is an unshaped kernel of the layer
    frame = re.compile("|".join(LAYER_FUNCTIONS))
    ratio = [
        work_ratio(o, a, b) if a is not None and not (o and frame.search(o)) else None
        for o, a, b in zip(ops, inner, new_inner, strict=True)
    ]
    unshaped = (
        pl.when(pl.col("_layer") & pl.col("kernel").str.contains("(?i)nccl"))
        .then(pl.lit(token_ratio))
        .when(pl.col("_layer"))
        .then(pl.lit(unshaped_ratio))
        .otherwise(pl.lit(1.0))
    )
    return (
        table.with_columns(
            pl.Series("inner_dims", new_inner, dtype=pl.String),
            pl.Series("outer_dims", new_outer, dtype=pl.String),
            pl.Series("_r", ratio, dtype=pl.Float64),
            in_layer.alias("_layer"),
        )
        .with_columns((pl.col("dur_us") * pl.col("_r").fill_null(unshaped)).alias("dur_us"))
        .drop("_r", "_layer")
    )


def _in_layers(table: pl.DataFrame, name: str) -> list[bool]:
    flags = [False] * table.height
    for a, b in layer_blocks(table, name):
        flags[a:b] = [True] * (b - a)
    return flags


@dataclass(frozen=True)
class _Gradients:
    """Gradient all-reduce buckets (elements) of the traced stages and the elements per layer."""

    buckets: dict[str, list[int]]
    per_layer: float
    layers: dict[str, int | None]

    def total(self, pos: str) -> int:
        return sum(self.buckets.get(pos, []))


def _bucket_rows(table: pl.DataFrame) -> list[int]:
    """Elements of each gradient all-reduce bucket of a ``reduce_grads`` table, in order."""
    rows = table.filter(pl.col("inner_op").str.contains("all_reduce").fill_null(False))
    out = []
    for text in rows["inner_dims"].to_list():
        dims = json.loads(text) if text else []
        first = dims[0] if dims and isinstance(dims[0], list) else []
        n = 1
        for x in first:
            n *= int(x)
        if first and n > SMALL_ALLREDUCE_ELEMENTS:
            out.append(n)
    return out


def _stage_gradients(run: DecodedRun, layers: dict[str, int | None]) -> _Gradients:
    """Per traced stage its gradient buckets, and the gradient elements of one transformer layer (the
    middle stage, a stage of transformer layers only; else head and tail together)."""
    buckets = {pos: _bucket_rows(run.tables[pos]["reduce_grads"]) for pos in POSITIONS}
    if layers.get("middle"):
        per_layer = sum(buckets["middle"]) / int(layers["middle"] or 1)
    else:
        n = int(layers["head"] or 0) + int(layers["tail"] or 0)
        per_layer = (sum(buckets["head"]) + sum(buckets["tail"])) / max(n, 1)
    return _Gradients(buckets, per_layer, layers)


def _target_gradients(grads: _Gradients, pos: str, layers: int, tp_ratio: float) -> int:
    """A stage's gradient elements at the target: its layers' and its extras (the embedding of the
    head, the final norm and output layer of the tail), all split by tensor parallelism."""
    have = int(grads.layers.get(pos) or 0)
    extras = max(grads.total(pos) - have * grads.per_layer, 0.0)
    return round((layers * grads.per_layer + extras) * tp_ratio)


def _rebucketed(table: pl.DataFrame, old: list[int], total: int, bucket: int | None) -> pl.DataFrame:
    """The reduce table with its gradient buckets (all-reduces and the scaling of each bucket) for
    ``total`` elements in buckets of at most ``bucket``: the first bucket's rows repeated or dropped."""
    if not old:
        return table
    new = [bucket] * (total // bucket) + ([total % bucket] if total % bucket else []) if bucket else [total]
    new = [n for n in new if n > 0] or [total]
    first = json.dumps([old[0]])

    def belongs(size: int) -> pl.Expr:
        return pl.col("inner_dims").str.starts_with(f"[[{size}]").fill_null(False)

    marked = table.with_row_index("_row").with_columns(
        pl.coalesce(
            *(pl.when(belongs(size)).then(pl.lit(i)) for i, size in enumerate(old)), pl.lit(None, pl.Int32)
        ).alias("_bucket")
    )
    template = marked.filter(pl.col("_bucket") == 0)
    if template.height == 0:
        return table
    at = int(template["_row"].min() or 0)  # type: ignore[arg-type]
    blocks = []
    for size in new:
        text = json.dumps([size])
        ratio = size / old[0]
        blocks.append(
            template.with_columns(
                pl.col("inner_dims").str.replace(first[1:-1], text[1:-1], literal=True),
                pl.col("outer_dims").str.replace(first[1:-1], text[1:-1], literal=True),
                pl.col("dur_us") * ratio,
            )
        )
    rest = marked.filter(pl.col("_bucket").is_null())
    before, after = rest.filter(pl.col("_row") < at), rest.filter(pl.col("_row") > at)
    return pl.concat([before, *blocks, after]).drop("_row", "_bucket")


def _repartitioned(table: pl.DataFrame, ratio: float) -> pl.DataFrame:
    """The optimizer step with its ZeRO partitions (the all-gather messages and every tensor of that
    many elements, the fp32 partition copies) times ``ratio``; the optimizer kernels, which record no
    shape, scale with them."""
    if abs(ratio - 1.0) < 1e-12:
        return table
    gathers = table.filter(pl.col("inner_op").str.contains("all_gather").fill_null(False))
    sizes: dict[int, int] = {}
    for text in gathers["inner_dims"].drop_nulls().to_list():
        dims = json.loads(text)
        if dims and isinstance(dims[0], list) and len(dims[0]) == 1:
            sizes[int(dims[0][0])] = max(1, round(int(dims[0][0]) * ratio))
    out = table
    for old, new in sizes.items():
        hit = pl.col("inner_dims").str.contains(f"[{old}]", literal=True).fill_null(False)
        out = out.with_columns(
            pl.when(hit).then(pl.col("dur_us") * (new / old)).otherwise(pl.col("dur_us")).alias("dur_us"),
            pl.col("inner_dims").str.replace_all(f"[{old}]", f"[{new}]", literal=True),
            pl.col("outer_dims").str.replace_all(f"[{old}]", f"[{new}]", literal=True),
        )
    optimizer = pl.col("inner_op").str.starts_with("Optimizer.step").fill_null(False)
    return out.with_columns(pl.when(optimizer).then(pl.col("dur_us") * ratio).otherwise(pl.col("dur_us")))


def _log_at(log: NeoxLog, layout: Layout, stages: list[list[str]]) -> NeoxLog:
    """The log as the framework would print it at ``layout`` (what ``reconstruct`` reads)."""
    world = layout.world_size
    gpn = layout.gpus_per_node or log.gpus_per_node
    nodes = max(1, -(-world // gpn)) if gpn else log.nodes
    return replace(
        log,
        pipe_parallel_size=layout.pp,
        model_parallel_size=layout.tp,
        data_parallel_size=layout.dp,
        world_size=world,
        nodes=nodes,
        gpus_per_node=min(gpn, world) if gpn else gpn,
        gradient_accumulation_steps=layout.micro_batches,
        train_micro_batch_size_per_gpu=layout.micro_batch_size,
        stage_layers=stages,
    )


def rebuild_at(
    job_dir: Path, target: Layout, *, misaligned: MisalignedFn | None = None, gpus: int | None = None
) -> tuple[RebuiltRun, Relayout]:
    """Read a decoded run folder and rebuild its iteration at ``target`` (``relayout`` + ``reconstruct``).

    Raises:
        LayoutError, PredictionError: see ``relayout``; InputNotFoundError, TraceFormatError: the folder.
    """
    run = read_decoded_run(job_dir)
    return rebuild_run_at(run, parse_neox_log(run.log_path), target, misaligned=misaligned, gpus=gpus)


def rebuild_run_at(
    run: DecodedRun, log: NeoxLog, target: Layout, *, misaligned: MisalignedFn | None = None, gpus: int | None = None
) -> tuple[RebuiltRun, Relayout]:
    """``rebuild_at`` of a run folder already read."""
    plan = relayout(run, log, target, gpus=gpus)
    rebuilt = reconstruct(plan.run, plan.log, misaligned)
    shape = RunShape.from_log(plan.log)
    layout = ParallelLayout(
        pp=shape.pp,
        tp=shape.tp,
        dp=shape.dp,
        nodes=plan.log.nodes,
        gpus_per_node=plan.log.gpus_per_node,
        source="relayout",
    )
    metadata: dict[str, Any] = {
        NEOX_LOG_KEY: plan.log.to_json(),
        "relayout": {"source": plan.source.text, "target": plan.layout.text, "notes": plan.notes},
        "reconstruction": {"stage_span_ns": rebuilt.stage_span_ns, "notes": rebuilt.notes},
    }
    return RebuiltRun(rebuilt.ranks, layout, metadata, [*plan.notes, *rebuilt.notes]), plan


class DecodedRelayout:
    """The GPUModeling25 source's ``relayout`` (``predict.relayout_source.SourceRelayout``): the decoded run
    in ``job_dir`` (what ``decoded_job_dir`` finds at the run's stored path) as the layout what-if rebuilds
    it. The log is read when first asked for, the kernel tables when the model's sizes or a rebuild need
    them."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir

    @cached_property
    def run(self) -> DecodedRun:
        return read_decoded_run(self.job_dir)

    @cached_property
    def log(self) -> NeoxLog:
        logs = sorted(self.job_dir.glob("*.log"))
        if not logs:
            raise PredictionError(f"{self.job_dir}: the decoded run folder holds no GPT-NeoX log (*.log)")
        return parse_neox_log(logs[0])

    @property
    def layout(self) -> Layout:
        return source_layout(self.log)

    @cached_property
    def dims(self) -> ModelDims:
        return model_dims(self.log, self.run)

    @property
    def facts(self) -> ModelFacts:
        return model_facts(self.log, self.dims)

    def first_stage_layers(self, layout: Layout) -> int:
        rule = partition_rule(self.log.stage_layers) or "uniform"
        layers = [name for stage in self.log.stage_layers for name in stage]
        counts = [sum(TRANSFORMER_LAYER in n for n in s) for s in partition(layers, layout.pp, rule)]
        if min(counts) < 1:
            raise LayoutError(f"layout {layout.text}: the {rule} partition leaves a stage without a transformer layer")
        return counts[0]

    def rebuild(self, target: Layout, *, gpus: int | None = None) -> RebuiltLayout:
        rebuilt, plan = rebuild_run_at(self.run, self.log, target, misaligned=misaligned_ops, gpus=gpus)
        return RebuiltLayout(as_folder_run(rebuilt, self.job_dir), plan, self.job_dir)

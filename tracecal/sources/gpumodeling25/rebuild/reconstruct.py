"""One training iteration of a decoded GPT-NeoX run, rebuilt as the rank traces DeepSpeed would write.

The published decoder kept only per-kernel tables of three ranks (head, one middle stage, tail). From
them and the run's log this module rebuilds the whole iteration of one rank per pipeline stage (the
first tensor- and data-parallel rank of each stage; the others are replicas) and hands it on as
ordinary Kineto-style events, so decode, storage and replay are those of every real trace:

* each stage runs DeepSpeed's 1F1B instruction stream (``pipeline_schedule``) over the log's
  micro-batches: per forward the stage forward table (its layers, the tensor-parallel all-reduces,
  the activation-checkpointed layer inputs), per backward the stage backward table (with the
  recompute), the activation sends of the best iteration's table, then the gradient reduction and the
  optimizer step (ZeRO all-gather included);
* middle stages use the middle rank's tables; a middle stage with another transformer-layer count
  than the traced one gets layer blocks added or removed (found by matching the encoder table);
* the receives mirror the neighbour's sends; a gradient send carries the largest activation tensor;
* in the optimizer step, DeepSpeed's ZeRO optimizer reduces the overflow flag and the gradient norm
  over the data-parallel group and then over the model-parallel group, which spans every stage: the
  second of each such pair of one-element all-reduces is a collective of all stages;
* kernels keep their measured mean duration and the true gap before them (``decoded_run.occurrences``);
  a collective joined by several stages (a send and its receive, the model-parallel all-reduces) starts
  when the last member arrives and lasts the shortest member's measured time, the others having waited.

The events of each rank are written by ``rebuilt_trace``: a compact CPU program ahead
of the GPU (never the bottleneck), nested in the DeepSpeed frames that name the measured modules.
Everything is documented in ``docs/published-runs.md``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tracecal.errors import TraceFormatError
from tracecal.ingest.input_dims import is_collective_operator, message_elements
from tracecal.ingest.trace import ParsedRank
from tracecal.sources.gpumodeling25.read.decoded_run import (
    BEST_BATCH_DIR,
    RUN_TABLES,
    DecodedRun,
    activity_kind,
    occurrences,
    read_decoded_run,
)
from tracecal.sources.gpumodeling25.read.neox_log import NeoxLog
from tracecal.sources.gpumodeling25.read.tables import MODULE_TIMES_KEY, NEOX_LOG_KEY
from tracecal.sources.gpumodeling25.rebuild.pipeline_schedule import stage_instructions
from tracecal.sources.gpumodeling25.rebuild.rebuilt_trace import GROUPS, PRECISION_TYPES, SCOPE, rank_events, types_for
from tracecal.vocabulary import ParallelLayout

_MODULE_SPAN = {"fwd": "stage_fwd", "bwd": "stage_bwd", "reduce_grads": "dp_allreduce", "optimizer_step": "optimizer"}
"""The run-level measured module whose mean span pins the gaps of each table (``occurrences``)."""

_COLLECTIVE = re.compile(
    r"(?i)nccl\w*Kernel_(?P<op>AllReduce|AllGather|ReduceScatter|SendRecv|Broadcast|Reduce|AllToAll)"
)
_KERNEL_DTYPE = re.compile(r"_(?P<t>half|float|double|bfloat16|uint8_t|int8_t|int32_t|int64_t)\(")
_NCCL_DTYPES = {"half": "Half", "float": "Float", "double": "Double", "bfloat16": "BFloat16", "uint8_t": "Byte"}
"""Kernel-name element types kept as they are; an ``int8_t`` kernel moves bytes of tensors of the run's
precision (send/recv and all-gather buffers)."""
SMALL_ALLREDUCE_ELEMENTS = 64
"""All-reduces of at most this many elements in the optimizer step are the ZeRO flag/norm reductions."""

ROW_SCHEMA = {
    "kernel": pl.String,
    "kind": pl.String,
    "dur_ns": pl.Int64,
    "gap_ns": pl.Int64,
    "outer_op": pl.String,
    "outer_id": pl.Int64,
    "outer_dims": pl.String,
    "inner_op": pl.String,
    "inner_id": pl.Int64,
    "inner_dims": pl.String,
    "coll": pl.String,
    "peer": pl.Int64,
    "nelems": pl.Int64,
    "coll_dtype": pl.String,
    "group": pl.String,
    "rendezvous": pl.String,
    "instruction": pl.Int64,
    "scope": pl.String,
    "layer": pl.Int64,
    "extra_scope": pl.String,
}
"""One row per GPU activity of a stage's iteration, in stream order (internal to this module)."""

MisalignedFn = Callable[[pl.DataFrame], "np.ndarray | pl.Series"]
"""Flags kernel-table rows whose CPU operator is not the one that launched the kernel: gets a frame
with ``cpu_op_name, input_dims, input_types, kernel_name, dur_ns`` and returns one bool per row."""


@dataclass(frozen=True)
class RunShape:
    """What the reconstruction needs from the log."""

    pp: int
    tp: int
    dp: int
    micro_batches: int
    iterations_traced: int
    layers_per_stage: list[int]
    precision: str

    @classmethod
    def from_log(cls, log: NeoxLog) -> RunShape:
        """Raises TraceFormatError when the log lacks a value the schedule needs."""
        missing = log.unstated(
            "pipe_parallel_size", "model_parallel_size", "data_parallel_size", "gradient_accumulation_steps"
        )
        if missing:
            raise TraceFormatError(f"{log.source}: the log states no {', '.join(missing)}; cannot rebuild the schedule")
        pp = int(log.pipe_parallel_size or 0)
        if pp < 2:
            raise TraceFormatError(f"{log.source}: pipe_parallel_size {pp}: a decoded run is a pipeline of >= 2 stages")
        layers = log.transformer_layers_per_stage
        if len(layers) != pp:
            raise TraceFormatError(
                f"{log.source}: the log lists {len(layers)} pipeline stages for pipe_parallel_size {pp} "
                "(the 'stage=N layers=M' partition listing is missing or cut)"
            )
        profiled = log.profiled_iterations
        return cls(
            pp=pp,
            tp=int(log.model_parallel_size or 1),
            dp=int(log.data_parallel_size or 1),
            micro_batches=int(log.gradient_accumulation_steps or 1),
            iterations_traced=len(profiled) if profiled else 1,
            layers_per_stage=layers,
            precision=log.precision or "fp16",
        )

    def rank_of(self, stage: int) -> int:
        """The stage's representative global rank (DeepSpeed orders ranks pipe, data, model)."""
        return stage * self.dp * self.tp

    def group(self, stage: int, kind: str) -> list[int]:
        """Global ranks of the representative rank's process group of ``kind`` (tp, dp, pp, mp)."""
        r = self.rank_of(stage)
        if kind == "tp":
            return list(range(r, r + self.tp))
        if kind == "dp":
            return [r + i * self.tp for i in range(self.dp)]
        if kind == "pp":
            return [s * self.dp * self.tp for s in range(self.pp)]
        return sorted(s * self.dp * self.tp + j for s in range(self.pp) for j in range(self.tp))  # mp: model x pipe


@dataclass
class Reconstruction:
    """The rebuilt ranks and what the rebuild noticed."""

    ranks: list[ParsedRank]
    stage_span_ns: list[int]
    misaligned_rows: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _position(stage: int, stages: int) -> str:
    return "head" if stage == 0 else "tail" if stage == stages - 1 else "middle"


def _kernel_rows(table: pl.DataFrame, n_occurrences: float, shape: RunShape) -> pl.DataFrame:
    """A kernel table as rows in stream order, with true gaps, activity kind and collective attributes
    (a collective's message from its own operator, else from its call's, ``_message_from_call``)."""
    _, nccl_default = PRECISION_TYPES.get(shape.precision, PRECISION_TYPES["fp16"])
    coll = table["kernel"].str.extract(_COLLECTIVE.pattern, 1).str.to_lowercase()
    kernel_type = table["kernel"].str.extract(_KERNEL_DTYPE.pattern, 1)
    rows = table.select(
        "kernel",
        activity_kind(pl.col("kernel")).alias("kind"),
        (pl.col("dur_us") * 1000).round().cast(pl.Int64).clip(lower_bound=0).alias("dur_ns"),
        (pl.col("overhead_us").clip(lower_bound=0) * 3000 / n_occurrences).round().cast(pl.Int64).alias("gap_ns"),
        "outer_op",
        "outer_id",
        "outer_dims",
        "inner_op",
        "inner_id",
        "inner_dims",
        pl.Series("coll", coll),
        *(
            pl.Series(n, v, dtype=pl.Int64)
            for n, v in zip(("nelems", "_frame"), _message_elements(table, coll), strict=True)
        ),
        pl.Series("coll_dtype", kernel_type)
        .replace_strict(_NCCL_DTYPES, default=nccl_default, return_dtype=pl.String)
        .alias("coll_dtype"),
    ).with_columns(pl.when(pl.col("coll").is_null()).then(None).otherwise(pl.col("coll_dtype")).alias("coll_dtype"))
    return _message_from_call(rows)


_OPERATOR_KIND = r"(allreduce|reducescatter|allgather|alltoall|broadcast)"
"""The collective an operator's name states, in the kernel's spelling (``coll``), letters only."""


def _message_from_call(rows: pl.DataFrame) -> pl.DataFrame:
    """Each collective kernel's message: as its own collective call states it, else as a collective
    call of its kind states it in the same occurrence of the outer operator, else as the operator
    around it states it (``_message_elements``).

    The decoder pairs kernels with operators by position, so a collective kernel may carry the
    enclosing frame (``CheckpointFunctionBackward``) or a ``record_param_comms`` without dims, while
    the call's ``nccl:all_gather`` range sits on the neighbouring rows (the copies into the output
    list it launches). Only an occurrence that states one message for the kind lends it."""
    kind = pl.col("inner_op").str.to_lowercase().str.replace_all(r"[^a-z]", "").str.extract(_OPERATOR_KIND, 1)
    stated = (
        rows.with_columns(kind.alias("_kind"))
        .filter(pl.col("nelems").is_not_null() & pl.col("_kind").is_not_null() & pl.col("outer_id").is_not_null())
        .group_by("outer_id", "_kind")
        .agg(pl.col("nelems").unique().alias("_n"))
        .filter(pl.col("_n").list.len() == 1)
        .select("outer_id", pl.col("_kind").alias("coll"), pl.col("_n").list.first())
    )
    return (
        rows.join(stated, on=["outer_id", "coll"], how="left", maintain_order="left")
        .with_columns(pl.coalesce("nelems", "_n", "_frame").alias("nelems"))
        .drop("_n", "_frame")
    )


def _message_elements(table: pl.DataFrame, coll: pl.Series) -> tuple[list[int | None], list[int | None]]:
    """Elements of each row's collective message from its innermost CPU operator's Input Dims
    (``input_dims.message_elements``): as a collective call states it (by its signature), and as
    another operator around the kernel states it (only where that cannot be a shard)."""
    ops, dims = table["inner_op"].to_list(), table["inner_dims"].to_list()
    cache: dict[tuple[str | None, str | None, str | None], tuple[int | None, int | None]] = {}
    own, frame = [], []
    for key in zip(ops, dims, coll.to_list(), strict=True):
        if key not in cache:
            if is_collective_operator(key[0]):  # every row of a call (the copies it launches too)
                cache[key] = (message_elements(*key), None)
            else:
                cache[key] = (None, message_elements(*key) if key[2] is not None else None)
        own.append(cache[key][0])
        frame.append(cache[key][1])
    return own, frame


LAYER_FUNCTIONS = (r"CheckpointFunction$", r"CheckpointFunctionBackward$")
"""The activation-checkpoint function (forward, backward) whose occurrences are the transformer layers."""


def layer_blocks(rows: pl.DataFrame, name: str) -> list[tuple[int, int]]:
    """Row ranges ``[start, stop)`` of the transformer layers of a stage table: every occurrence of the
    activation-checkpoint function (the outermost CPU operator, one External id per layer) spans from
    its first to its last row, kernels it launched through the driver included."""
    pattern = LAYER_FUNCTIONS[0 if name == "fwd" else 1]
    hit = rows.with_row_index("_row").filter(pl.col("outer_op").str.contains(pattern).fill_null(False))
    if hit.height == 0:
        return []
    spans = hit.group_by("outer_id", maintain_order=True).agg(pl.col("_row").min(), pl.col("_row").max().alias("_last"))
    return [(int(a), int(b) + 1) for a, b in zip(spans["_row"], spans["_last"], strict=True)]


def _with_layers(
    rows: pl.DataFrame, blocks: list[tuple[int, int]], target: int
) -> tuple[pl.DataFrame, list[tuple[int, int]]]:
    """``rows`` with the last layer block repeated, or trailing layer blocks removed, so that it holds
    ``target`` layers."""
    have = len(blocks)
    if not blocks or have == target:
        return rows, blocks
    start, stop = blocks[-1]
    if target < have:
        cut = blocks[target][0]
        return pl.concat([rows[:cut], rows[stop:]]), blocks[:target]
    width, extra = stop - start, target - have
    out = pl.concat([rows[:stop], *([rows[start:stop]] * extra), rows[stop:]])
    return out, [*blocks, *((stop + width * i, stop + width * (i + 1)) for i in range(extra))]


class _StagePlan:
    """The rows of one stage's iteration, built instruction by instruction."""

    def __init__(self) -> None:
        self.parts: list[pl.DataFrame] = []

    def add(self, rows: pl.DataFrame, instruction: int, scope: str, **cols: object) -> None:
        if rows.height == 0:
            return
        extra = {k: pl.lit(v, dtype=ROW_SCHEMA[k]) for k, v in cols.items() if k not in rows.columns}
        full = rows.with_columns(
            pl.lit(instruction, dtype=pl.Int64).alias("instruction"), pl.lit(scope).alias("scope"), **extra
        )
        missing = {k: pl.lit(None, dtype=t) for k, t in ROW_SCHEMA.items() if k not in full.columns}
        self.parts.append(full.with_columns(**missing).select(list(ROW_SCHEMA)))

    def frame(self) -> pl.DataFrame:
        return pl.concat(self.parts) if self.parts else pl.DataFrame(schema=ROW_SCHEMA)


def _stage_blocks(
    run: DecodedRun, shape: RunShape, misaligned: MisalignedFn | None
) -> tuple[
    dict[tuple[str, str], pl.DataFrame], dict[tuple[str, str], list[tuple[int, int]]], dict[str, int], dict[str, str]
]:
    """Per (position, table): rows with gaps, CPU ops cleared where misaligned; layer starts of fwd/bwd;
    where each position's activation sends came from (``_send_table``)."""
    avg = run.module_times.get("run_level_average", {})
    blocks: dict[tuple[str, str], pl.DataFrame] = {}
    layers: dict[tuple[str, str], list[tuple[int, int]]] = {}
    flagged: dict[str, int] = {}
    send_sources: dict[str, str] = {}
    per_iteration = {"fwd": shape.micro_batches, "bwd": shape.micro_batches, "reduce_grads": 1, "optimizer_step": 1}
    positions = ("head", "middle", "tail") if shape.pp > 2 else ("head", "tail")
    for pi, pos in enumerate(("head", "middle", "tail")):
        if pos not in positions:
            continue
        for name, per in per_iteration.items():
            table = run.tables[pos][name]
            span = avg.get(_MODULE_SPAN[name])
            n = occurrences(table, span[pi] if span else None, per * shape.iterations_traced)
            rows = _kernel_rows(table, n, shape)
            if name in ("fwd", "bwd"):
                layers[(pos, name)] = layer_blocks(rows, name)
            if misaligned is not None:
                frame_rows = rows["inner_op"].str.contains("|".join(LAYER_FUNCTIONS)).fill_null(False).to_numpy()
                mask = _misaligned_mask(rows, shape, misaligned) & ~frame_rows  # a frame launches any kernel
                if mask.any():
                    flagged[f"{pos}/{name}"] = int(mask.sum())
                    rows = _clear_cpu_ops(rows, mask)
            blocks[(pos, name)] = rows
        if pi == 2 or pos not in positions:
            continue  # the last stage sends no activations
        found = _send_table(run, pos, pi, shape)
        if found is not None:
            send, source = found
            span = avg.get("pp_p2p")
            n = occurrences(send, span[pi] if span else None, shape.micro_batches)
            blocks[(pos, "pp_p2p")] = _kernel_rows(send, n, shape)
            send_sources[pos] = source
    _share_send_transfers(blocks)
    _share_collective_sizes(blocks, "optimizer_step")
    return blocks, layers, flagged, send_sources


SEND_KERNEL = "ncclKernel_SendRecv"
"""The kernel name of a send rebuilt from the measured module time (no table recorded its kernel)."""


def _send_table(run: DecodedRun, pos: str, index: int, shape: RunShape) -> tuple[pl.DataFrame, str] | None:
    """The activation-send table of a traced position and where it came from, the first that has it:
    the best iteration's ``pp_p2p`` table, one in the rank folder, the SendRecv kernels of the rank's
    main tables, else one send kernel per send whose duration is the position's measured ``pp_p2p``
    span (module times) and whose size is the activation the log states (micro-batch × sequence ×
    hidden, a 1/tp share when the pipeline is partitioned). None when nothing says."""
    best = run.best_batch.get(pos, {}).get("pp_p2p")
    if best is not None:
        return best, f"{BEST_BATCH_DIR}/{index}/pp_p2p.csv"
    own = run.rank_extras.get(pos, {}).get("pp_p2p")
    if own is not None:
        return own, f"{index}/pp_p2p.csv"
    main = pl.concat([run.tables[pos][name] for name in RUN_TABLES]).filter(pl.col("kernel").str.contains("SendRecv"))
    if main.height:
        return main, f"the SendRecv kernels of {index}/*.csv"
    spans = run.module_times.get("run_level_average") or run.module_times.get("best_batch_average") or {}
    span_us = (spans.get("pp_p2p") or [0.0] * 3)[index]
    log = run.log
    sizes = (log.train_micro_batch_size_per_gpu, log.seq_length, log.hidden_size)
    if not span_us or any(v is None for v in sizes):
        return None
    elements = prod(v for v in sizes if v is not None) // (shape.tp if log.pipe_partitioned else 1)
    row = {
        "outer_op": None, "outer_id": None, "outer_dims": None, "inner_op": "nccl:send", "inner_id": None,
        "inner_dims": f"[[{elements}]]", "kernel": SEND_KERNEL, "overhead_us": 0.0, "dur_us": float(span_us),
    }  # fmt: skip
    table = pl.DataFrame([row], schema=_TABLE_SCHEMA)
    return table, f"the measured pp_p2p span of module_times (one send of {elements} elements)"


_TABLE_SCHEMA = {
    "outer_op": pl.String, "outer_id": pl.Int64, "outer_dims": pl.String, "inner_op": pl.String,
    "inner_id": pl.Int64, "inner_dims": pl.String, "kernel": pl.String, "overhead_us": pl.Float64,
    "dur_us": pl.Float64,
}  # fmt: skip
"""``decoded_run.read_kernel_table``'s columns."""


def _share_send_transfers(blocks: dict[tuple[str, str], pl.DataFrame]) -> None:
    """The traced send tables send the same tensors: the k-th point-to-point kernel of each takes the
    shortest measured duration among them (the longer ones include waiting for their receiver, which
    the schedule adds back) and, where a table lost the tensor's size, the size another one recorded."""
    sends = {key: rows for key, rows in blocks.items() if key[1] == "pp_p2p"}
    p2p = {key: rows.filter(pl.col("coll") == "sendrecv") for key, rows in sends.items()}
    if len(p2p) < 2 or len({t.height for t in p2p.values()}) != 1:
        return
    stacked = pl.concat([t.select("dur_ns", "nelems").with_row_index("_k") for t in p2p.values()])
    common = stacked.group_by("_k").agg(pl.col("dur_ns").min(), pl.col("nelems").drop_nulls().first()).sort("_k")
    for key, rows in sends.items():
        k = pl.when(pl.col("coll") == "sendrecv").then(pl.col("coll").cum_count().over("coll") - 1)
        joined = rows.with_columns(k.cast(pl.UInt32).alias("_k")).join(
            common.rename({"dur_ns": "_dur", "nelems": "_n"}), on="_k", how="left", maintain_order="left"
        )
        blocks[key] = joined.with_columns(
            pl.coalesce("_dur", "dur_ns").alias("dur_ns"), pl.coalesce("nelems", "_n").alias("nelems")
        ).drop("_k", "_dur", "_n")


def _share_collective_sizes(blocks: dict[tuple[str, str], pl.DataFrame], table: str) -> None:
    """Every stage runs the same code path through ``table`` (the optimizer step: ZeRO's flag and norm
    reductions, its all-gathers), so the k-th collective of a kind is the same tensor on every traced
    rank: where one table lost its size (a ``record_param_comms`` row without dims), it takes the size
    another traced rank recorded. Only when the tables hold as many collectives of each kind."""
    tables = {key: rows for key, rows in blocks.items() if key[1] == table}
    k = pl.when(pl.col("coll").is_not_null()).then(pl.col("coll").cum_count().over("coll") - 1).cast(pl.UInt32)
    numbered = {key: rows.with_columns(k.alias("_k")) for key, rows in tables.items()}
    counts = {key: dict(rows.group_by("coll").len().drop_nulls().iter_rows()) for key, rows in numbered.items()}
    if len(tables) < 2 or len({tuple(sorted(c.items())) for c in counts.values()}) != 1:
        return
    stacked = pl.concat(
        [rows.filter(pl.col("_k").is_not_null()).select("coll", "_k", "nelems") for rows in numbered.values()]
    )
    known = stacked.group_by("coll", "_k").agg(pl.col("nelems").drop_nulls().first().alias("_n"))
    for key, rows in numbered.items():
        blocks[key] = (
            rows.join(known, on=["coll", "_k"], how="left", maintain_order="left")
            .with_columns(pl.coalesce("nelems", "_n").alias("nelems"))
            .drop("_k", "_n")
        )


def _misaligned_mask(rows: pl.DataFrame, shape: RunShape, misaligned: MisalignedFn) -> np.ndarray:
    aten_type, _ = PRECISION_TYPES.get(shape.precision, PRECISION_TYPES["fp16"])
    frame = rows.select(
        pl.col("inner_op").alias("cpu_op_name"),
        pl.col("inner_dims").alias("input_dims"),
        pl.col("inner_dims")
        .map_elements(lambda d: types_for(d, aten_type), return_dtype=pl.String)
        .alias("input_types"),
        pl.col("kernel").alias("kernel_name"),
        "dur_ns",
    )
    return np.asarray(misaligned(frame), dtype=bool)


def _clear_cpu_ops(rows: pl.DataFrame, mask: np.ndarray) -> pl.DataFrame:
    """Rows whose CPU operator launched another kernel lose it: the kernel keeps its time, no shape."""
    bad = pl.Series(mask)
    return rows.with_columns(
        *(
            pl.when(bad).then(None).otherwise(pl.col(c)).alias(c)
            for c in ("outer_op", "outer_dims", "inner_op", "inner_dims")
        )
    )


def _stage_layers(
    stage: int,
    shape: RunShape,
    blocks: dict[tuple[str, str], pl.DataFrame],
    layers: dict[tuple[str, str], list[tuple[int, int]]],
    notes: list[str],
) -> dict[str, pl.DataFrame]:
    """The forward and backward rows of ``stage`` with a ``layer`` column, the layer count adjusted
    where the stage has another count than the traced rank it borrows its tables from."""
    pos = _position(stage, shape.pp)
    traced_stage = {"head": 0, "middle": 1, "tail": shape.pp - 1}[pos]
    want = shape.layers_per_stage[stage]
    out = {}
    for name in ("fwd", "bwd"):
        rows, spans = blocks[(pos, name)], layers[(pos, name)]
        if want != shape.layers_per_stage[traced_stage] and spans:
            rows, spans = _with_layers(rows, spans, want)
            notes.append(
                f"stage {stage}: {want} transformer layers, the traced {pos} stage has "
                f"{shape.layers_per_stage[traced_stage]}: {name} layer blocks adjusted"
            )
        if len(spans) != want:
            notes.append(f"stage {stage} {name}: {len(spans)} of {want} transformer layers recognised")
        layer = np.full(rows.height, -1, dtype=np.int64)
        for i, (a, b) in enumerate(spans):
            layer[a:b] = i
        out[name] = rows.with_columns(pl.Series("layer", layer).replace(-1, None), pl.lit("tp").alias("group"))
    return out


def _plan_stage(
    stage: int,
    shape: RunShape,
    blocks: dict[tuple[str, str], pl.DataFrame],
    layers: dict[tuple[str, str], list[tuple[int, int]]],
    notes: list[str],
) -> pl.DataFrame:
    """All GPU rows of ``stage``'s iteration in stream order, with rendezvous keys and scopes."""
    pos = _position(stage, shape.pp)
    both = _stage_layers(stage, shape, blocks, layers, notes)
    fwd = both["fwd"].with_columns(
        pl.when((pl.col("coll") == "allreduce") & (pl.col("outer_op") != SCOPE["tp_reduce"]))
        .then(pl.lit(SCOPE["tp_reduce"]))
        .alias("extra_scope")
    )
    bwd = both["bwd"]
    # the tensor-parallel region frame holds its all-reduce only: a table row naming it over another
    # kernel took the name from a neighbouring position (the published decoder aligns by position)
    fwd, bwd = (
        rows.with_columns(
            pl.when((pl.col(op) == SCOPE["tp_reduce"]) & pl.col("coll").is_null())
            .then(None)
            .otherwise(pl.col(op))
            .alias(op)
            for op in ("outer_op", "inner_op")
        )
        for rows in (fwd, bwd)
    )
    sends: dict[int, pl.DataFrame] = {}
    for s in range(shape.pp - 1):
        table = blocks.get((_position(s, shape.pp), "pp_p2p"))
        if table is None:
            sender = _position(s, shape.pp)
            index = {"head": 0, "middle": 1}.get(sender, 2)
            raise TraceFormatError(
                f"no activation sends for the {sender} stage: missing {BEST_BATCH_DIR}/{index}/pp_p2p.csv, "
                f"{index}/pp_p2p.csv, SendRecv kernels in {index}/*.csv, and a pp_p2p module time with the "
                "log's micro-batch size, seq_length and hidden_size; the pipeline cannot be rebuilt"
            )
        sends[s] = table
    reduce_rows = blocks[(pos, "reduce_grads")].with_columns(pl.lit("dp").alias("group"))
    opt = _optimizer_rows(blocks[(pos, "optimizer_step")])
    plan = _StagePlan()
    for i, ins in enumerate(stage_instructions(stage, shape.pp, shape.micro_batches)):
        mb = ins.micro_batch
        if ins.kind == "forward":
            plan.add(fwd, i, "forward", extra_scope=None)
        elif ins.kind == "backward":
            plan.add(bwd, i, "backward")
        elif ins.kind == "send_activation":
            plan.add(_p2p(sends[stage], f"act|{stage}|{mb}", "send"), i, "send_activation")
        elif ins.kind == "recv_activation":
            plan.add(_p2p(_recv_of(sends[stage - 1]), f"act|{stage - 1}|{mb}", "recv"), i, "recv_activation")
        elif ins.kind == "send_grad":
            plan.add(_p2p(_grad_of(sends[stage - 1]), f"grad|{stage}|{mb}", "send"), i, "send_grad")
        elif ins.kind == "recv_grad":
            plan.add(_p2p(_grad_of(sends[stage]), f"grad|{stage + 1}|{mb}", "recv"), i, "recv_grad")
        elif ins.kind == "reduce_grads":
            plan.add(reduce_rows, i, "reduce_grads")
        elif ins.kind == "optimizer_step":
            plan.add(opt, i, "optimizer_step")
        elif ins.kind == "aggregate_loss":
            plan.add(_loss_rows(stage, shape, opt), i, "aggregate_loss")
    return plan.frame()


LOSS_BROADCAST_KERNEL = "ncclKernel_Broadcast_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
LOSS_ALLREDUCE_KERNEL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
"""Kernels of the loss aggregation that ends DeepSpeed's ``train_batch`` (no table records them)."""


def _loss_rows(stage: int, shape: RunShape, opt: pl.DataFrame) -> pl.DataFrame:
    """DeepSpeed's ``train_batch`` ends after the optimizer step with ``_aggregate_total_loss``: the last
    stage averages the loss over its data-parallel group (a one-element all-reduce) and broadcasts
    the pair (stage loss, average) over the pipeline group, which every other stage receives. The
    broadcast is one collective of all stages, so every stage's iteration ends when the last one has
    finished its optimizer step. No table records these kernels: each takes the shortest, and the gap
    before it the median, of the stage's own one-element optimizer all-reduces (a tiny collective on
    the same network)."""
    small = opt.filter((pl.col("coll") == "allreduce") & (pl.col("nelems") <= SMALL_ALLREDUCE_ELEMENTS))
    if small.height == 0:
        return pl.DataFrame(schema={k: v for k, v in ROW_SCHEMA.items() if k not in _PLAN_COLUMNS})
    dur, gap = int(small["dur_ns"].min()), int(small["gap_ns"].median())  # type: ignore[arg-type]
    rows: list[tuple[str, str, int, str, str, str | None]] = []
    if stage == shape.pp - 1 and shape.dp > 1:
        rows.append((LOSS_ALLREDUCE_KERNEL, "nccl:all_reduce", 1, "allreduce", "dp", None))
    rows.append((LOSS_BROADCAST_KERNEL, "nccl:broadcast", 2, "broadcast", "pp", "loss"))
    return pl.DataFrame(
        {
            "kernel": [r[0] for r in rows],
            "kind": ["kernel"] * len(rows),
            "dur_ns": [dur] * len(rows),
            "gap_ns": [gap] * len(rows),
            "inner_op": [r[1] for r in rows],
            "inner_dims": [f"[[{r[2]}]]" for r in rows],
            "coll": [r[3] for r in rows],
            "nelems": [r[2] for r in rows],
            "coll_dtype": ["Float"] * len(rows),
            "group": [r[4] for r in rows],
            "rendezvous": [r[5] for r in rows],
        },
        schema={k: ROW_SCHEMA[k] for k in ("kernel", "kind", "dur_ns", "gap_ns", "inner_op", "inner_dims", "coll",
                                            "nelems", "coll_dtype", "group", "rendezvous")},
    )  # fmt: skip


_PLAN_COLUMNS = ("instruction", "scope", "layer", "extra_scope")
"""Row columns ``_StagePlan.add`` sets."""


def _p2p(rows: pl.DataFrame, key: str, direction: str) -> pl.DataFrame:
    """Send or receive rows; every point-to-point kernel gets the rendezvous key of its pair."""
    p2p = pl.col("coll") == "sendrecv"
    numbered = pl.when(p2p).then(
        pl.concat_str([pl.lit(key), pl.col("coll").cum_count().over("coll").cast(pl.String)], separator="|")
    )
    return rows.with_columns(
        numbered.alias("rendezvous"),
        pl.when(p2p).then(pl.lit(direction)).otherwise(pl.col("coll")).alias("coll"),
        pl.lit("pp").alias("group"),
    )


def _recv_of(send: pl.DataFrame) -> pl.DataFrame:
    """The receives matching a send table: its point-to-point kernels, received into a buffer."""
    return send.filter(pl.col("coll") == "sendrecv").with_columns(
        pl.lit("nccl:recv").alias("inner_op"), pl.lit(None, pl.String).alias("outer_op")
    )


def _grad_of(send: pl.DataFrame) -> pl.DataFrame:
    """A gradient send/receive: the largest activation tensor of the send table, back the other way."""
    p2p = send.filter(pl.col("coll") == "sendrecv")
    return (
        p2p.sort("nelems", descending=True, nulls_last=True)
        .head(1)
        .with_columns(pl.lit(None, pl.String).alias("outer_op"))
    )


def _optimizer_rows(rows: pl.DataFrame) -> pl.DataFrame:
    """Optimizer-step rows: all-gathers in the ZeRO partition all-gather scope, and the one-element
    all-reduces paired data-parallel first, model-parallel (all stages) second."""
    small = (pl.col("coll") == "allreduce") & (pl.col("nelems") <= SMALL_ALLREDUCE_ELEMENTS)
    rank_in_small = pl.when(small).then(pl.col("coll").cum_count().over(small)).otherwise(None)
    return (
        rows.with_columns(rank_in_small.alias("_k"))
        .with_columns(
            pl.when(small & (pl.col("_k") % 2 == 0))
            .then(pl.lit("mp"))
            .when(pl.col("coll").is_not_null())
            .then(pl.lit("dp"))
            .alias("group"),
            pl.when(small & (pl.col("_k") % 2 == 0))
            .then(pl.concat_str([pl.lit("mp|"), (pl.col("_k") // 2).cast(pl.String)]))
            .alias("rendezvous"),
            pl.when(pl.col("coll") == "allgather").then(pl.lit(SCOPE["all_gather"])).alias("extra_scope"),
        )
        .drop("_k")
    )


def layout(plans: list[pl.DataFrame]) -> list[tuple[np.ndarray, np.ndarray]]:
    """GPU start and end (ns from the iteration start) of every row of every stage.

    Each stage runs its rows in order, each after its gap; a row with a rendezvous key waits for every
    stage that holds the key, starts (on each member) when that member arrives, and ends for all when
    the last arrival plus the shortest member duration has passed.

    Raises:
        TraceFormatError: the stages wait for each other in a cycle (the tables do not form a schedule).
    """
    n = len(plans)
    gap = [p["gap_ns"].to_numpy() for p in plans]
    dur = [p["dur_ns"].to_numpy() for p in plans]
    keys = [p["rendezvous"].to_list() for p in plans]
    members: dict[str, list[tuple[int, int]]] = {}
    for s, ks in enumerate(keys):
        for i, k in enumerate(ks):
            if k is not None:
                members.setdefault(k, []).append((s, i))
    start = [np.zeros(len(g), dtype=np.int64) for g in gap]
    end = [np.zeros(len(g), dtype=np.int64) for g in gap]
    clock = [0] * n
    at = [0] * n
    arrived: dict[str, dict[int, int]] = {}
    while True:
        moved = False
        for s in range(n):
            ks, g, d = keys[s], gap[s], dur[s]
            while at[s] < len(ks):
                i, k = at[s], keys[s][at[s]]
                if k is None or len(members[k]) == 1:
                    start[s][i] = clock[s] + g[i]
                    end[s][i] = start[s][i] + d[i]
                    clock[s] = int(end[s][i])
                    at[s] += 1
                    moved = True
                    continue
                arrivals = arrived.setdefault(k, {})
                arrivals.setdefault(s, clock[s] + int(g[i]))
                if len(arrivals) < len(members[k]):
                    break
                finish = max(arrivals.values()) + min(int(dur[m][j]) for m, j in members[k])
                for m, j in members[k]:
                    start[m][j], end[m][j] = arrivals[m], finish
                    clock[m], at[m] = finish, j + 1
                moved = True
        if all(at[s] == len(keys[s]) for s in range(n)):
            return list(zip(start, end, strict=True))
        if not moved:
            stuck = sorted({keys[s][at[s]] for s in range(n) if at[s] < len(keys[s])})
            raise TraceFormatError(f"the rebuilt pipeline stages wait for each other forever at {stuck[:4]}")


def reconstruct(run: DecodedRun, log: NeoxLog, misaligned: MisalignedFn | None = None) -> Reconstruction:
    """Rebuild one iteration of every pipeline stage of a decoded run as rank traces.

    Raises:
        TraceFormatError: the log lacks the layout, or the tables cannot form the schedule.
    """
    shape = RunShape.from_log(log)
    blocks, layers, flagged, send_sources = _stage_blocks(run, shape, misaligned)
    notes: list[str] = []
    if not run.has_best_batch_statistics:
        taken = "; ".join(f"{pos}: {source}" for pos, source in send_sources.items())
        notes.append(
            f"no {BEST_BATCH_DIR}/: activation sends from {taken or 'nowhere'}; data-parallel and optimizer "
            "kernels from the main reduce_grads.csv and optimizer_step.csv tables"
        )
    plans = [_plan_stage(s, shape, blocks, layers, notes) for s in range(shape.pp)]
    plans = [_with_peers(p, s, shape) for s, p in enumerate(plans)]
    times = layout(plans)
    ranks = [
        ParsedRank(
            rank=shape.rank_of(s),
            rank_source="reconstruction",
            events=rank_events(
                plan,
                st,
                en,
                rank=shape.rank_of(s),
                groups={k: shape.group(s, k) for k in GROUPS},
                aten_type=PRECISION_TYPES.get(shape.precision, PRECISION_TYPES["fp16"])[0],
            ),
            file=run.job_dir / ("0" if s == 0 else "2" if s == shape.pp - 1 else "1"),
            file_bytes=0,
            format="gpumodeling25",
            world_size=shape.pp * shape.tp * shape.dp,
            backend="nccl",
            schema_era="decoded",
        )
        for s, (plan, (st, en)) in enumerate(zip(plans, times, strict=True))
    ]
    spans = [int(en.max() - st.min()) if st.size else 0 for st, en in times]
    return Reconstruction(ranks, spans, flagged, notes)


def _with_peers(plan: pl.DataFrame, stage: int, shape: RunShape) -> pl.DataFrame:
    """The global rank of the peer of every send and receive (activations go down, gradients up)."""
    scope = pl.col("scope")
    peer_stage = (
        pl.when(scope.is_in(["send_activation", "recv_grad"]))
        .then(pl.lit(stage + 1))
        .when(scope.is_in(["recv_activation", "send_grad"]))
        .then(pl.lit(stage - 1))
    )
    return plan.with_columns(
        pl.when(pl.col("coll").is_in(["send", "recv"])).then(peer_stage * shape.dp * shape.tp).alias("peer")
    )


@dataclass(frozen=True)
class RebuiltRun:
    """A decoded run ready for the loader: its rank traces, the layout the log states and the run's
    metadata (the log, the measured module times, the published comparison, what the rebuild noticed)."""

    ranks: list[ParsedRank]
    layout: ParallelLayout
    metadata: dict[str, Any]
    notes: list[str]


def rebuild_run(
    job_dir: Path, name_layout: ParallelLayout | None = None, misaligned: MisalignedFn | None = None
) -> RebuiltRun:
    """Read a decoded run's job folder and rebuild its iteration (``reconstruct``).

    ``name_layout``: what the folder name says, used only for values the log does not state.

    Raises:
        InputNotFoundError, TraceFormatError: a table or the log is missing or malformed.
    """
    run = read_decoded_run(job_dir)
    log = run.log
    rebuilt = reconstruct(run, log, misaligned)
    layout = ParallelLayout(
        pp=log.pipe_parallel_size,
        tp=log.model_parallel_size,
        dp=log.data_parallel_size,
        nodes=log.nodes,
        gpus_per_node=log.gpus_per_node,
        source="log",
    )
    if name_layout is not None:
        layout = layout.merged(name_layout)
    notes = [
        f"rebuilt one rank per pipeline stage ({', '.join(str(r.rank) for r in rebuilt.ranks)}); "
        "the tensor- and data-parallel replicas of a stage are taken to run the same kernels",
        *rebuilt.notes,
    ]
    if rebuilt.misaligned_rows:
        total = sum(rebuilt.misaligned_rows.values())
        notes.append(
            f"{total} kernel-table rows pair a CPU operator with another op's kernel "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(rebuilt.misaligned_rows.items()))}); "
            "their kernels keep their time without a shape (no model, left out of validation)"
        )
    times = run.module_times
    metadata: dict[str, Any] = {
        NEOX_LOG_KEY: log.to_json(),
        MODULE_TIMES_KEY: {k.removeprefix("run_level_"): v for k, v in times.items() if k.startswith("run_level_")},
        "best_batch_module_times": {
            k.removeprefix("best_batch_"): v for k, v in times.items() if k.startswith("best_batch_")
        },
        "published_compares": run.compares,
        "reconstruction": {
            "stage_span_ns": rebuilt.stage_span_ns,
            "misaligned_rows": rebuilt.misaligned_rows,
            "notes": notes,
        },
    }
    return RebuiltRun(rebuilt.ranks, layout, metadata, notes)

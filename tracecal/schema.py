"""Every table tracecal stores: columns, SQL types, units and documentation, declared once.

Everything else derives from this module:
- the DDL in ``tracecal/sql/tables/*.sql`` is generated from it (``python -m tracecal.schema``) and a
  test fails when the committed files drift from it;
- Arrow schemas for record batches (``arrow_schema(TABLE)``) and polars schemas (``polars_schema``) come from it;
- ``tracecal sql`` users read the same docs through DuckDB's ``COMMENT ON COLUMN``.

Conventions: times are int64 nanoseconds named ``*_ns``; sizes are bytes named ``*_bytes``; every
table is keyed by ``run_id`` (or ``cluster`` for samples/models) so one database holds many runs.
A missing value is NULL, never 0.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import polars as pl

SCHEMA_VERSION = 2
"""Bumped whenever a table changes incompatibly; stored in ``tracecal_meta``. 2: ``events`` is a view
of Parquet files beside the database (``tracecal.sql.event_store``), no longer a table."""

SAMPLES_FILE_VERSION = 1
"""Version of the samples Parquet files ``tracecal samples export`` writes (their ``SAMPLES`` columns),
stored in each file's metadata; bumped when ``SAMPLES`` changes incompatibly. Independent of
``SCHEMA_VERSION``: a change of how a database stores its runs leaves sample files readable."""


@dataclass(frozen=True)
class Column:
    """One column: name (units in the suffix), DuckDB type, and what it means."""

    name: str
    sql_type: str
    doc: str


@dataclass(frozen=True)
class Table:
    """A stored table: name, one-paragraph doc and ordered columns."""

    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name} has no column {name}")


def _cols(*specs: tuple[str, str, str] | Column) -> tuple[Column, ...]:
    return tuple(s if isinstance(s, Column) else Column(*s) for s in specs)


# --- column groups shared by several tables -------------------------------------------------------

SHAPE_COLUMNS = _cols(
    ("batch", "BIGINT", "GEMM batch count (bmm/baddbmm), micro-batch size, optimizer: tensors updated"),
    ("m", "BIGINT", "GEMM rows of the output (M)"),
    ("n", "BIGINT", "GEMM columns of the output (N)"),
    ("k", "BIGINT", "GEMM reduction dimension (K)"),
    ("heads", "BIGINT", "attention heads processed by this operator (per tensor-parallel rank)"),
    ("seq_q", "BIGINT", "attention query sequence length"),
    ("seq_k", "BIGINT", "attention key/value sequence length"),
    ("head_dim", "BIGINT", "attention head dimension"),
    ("causal", "BOOLEAN", "attention is causal (masked upper triangle)"),
    ("elements", "BIGINT", "elements of the main input tensor (elementwise, norm, softmax, loss)"),
    ("tokens", "BIGINT", "tokens looked up (embedding) or rows of the loss, softmax or norm input"),
    ("vocab", "BIGINT", "vocabulary rows (embedding, loss), per tensor-parallel rank"),
    ("hidden", "BIGINT", "embedding/norm width, softmax row length, optimizer: commonest 1-D param length"),
    ("params", "BIGINT", "parameters updated (optimizer step)"),
    ("dtype", "VARCHAR", "element type of the main input: float32, float16, bfloat16, ..."),
    ("flops", "DOUBLE", "floating-point operations derived from the shape (2·M·N·K·batch for GEMM)"),
    ("io_bytes", "DOUBLE", "bytes read plus written, derived from the shape and dtype"),
)
"""Shape features shared by traced operators and microbenchmark samples: the join key of the product
(docs/calibration.md#features). The same code in ``tracecal.decode.shape_features`` fills them on both sides."""

COMM_COLUMNS = _cols(
    ("size_bytes", "BIGINT", "collective payload in bytes (nccl-tests S: the total size for gathers)"),
    ("group_size", "INTEGER", "ranks in the process group"),
    ("nodes", "INTEGER", "nodes spanned by the group, when known"),
    ("gpus_per_node", "INTEGER", "GPUs per node of the group's ranks, when known"),
)
"""Features of collectives shared by the ``collectives`` table and communication samples."""


REPLAY_COLUMN = Column(
    "replay",
    "VARCHAR",
    "fitted (the slack the dependency graph cannot explain kept as fixed lags) or dependency "
    "(only dependencies and nominal lags); NULL in rows written before both were stored",
)
"""Which replay a ``predictions`` / ``components`` row belongs to."""


# --- tables ----------------------------------------------------------------------------------------

RUNS = Table(
    "runs",
    "One row per ingested run (a directory of rank traces). Re-ingesting a run replaces its row.",
    _cols(
        ("run_id", "VARCHAR", "run identifier: the directory name unless --run-id was given"),
        ("name", "VARCHAR", "human-readable run name (the directory name)"),
        ("source_path", "VARCHAR", "absolute path of the run directory at ingest time"),
        ("format", "VARCHAR", "trace format: kineto or nsys"),
        ("cluster", "VARCHAR", "cluster the run was taken on (--cluster), used to pick calibrated models"),
        ("model", "VARCHAR", "model name from the run name or run.json (e.g. GPT_20B)"),
        ("pp", "INTEGER", "pipeline-parallel size; NULL when unknown"),
        ("tp", "INTEGER", "tensor-parallel size; NULL when unknown"),
        ("dp", "INTEGER", "data-parallel size; NULL when unknown"),
        ("nodes", "INTEGER", "nodes of the job; NULL when unknown"),
        ("gpus_per_node", "INTEGER", "GPUs (ranks) per node; NULL when unknown"),
        ("world_size", "INTEGER", "ranks in the job (distributedInfo.world_size, else rank files found)"),
        ("ranks_found", "INTEGER", "rank traces present in the run directory"),
        ("layout_source", "VARCHAR", "where pp/tp/dp came from: flags, run_name, log, run_json, pg_config"),
        ("iteration_marker", "VARCHAR", "regex that delimited iterations (default ProfilerStep#N)"),
        ("metadata_json", "VARCHAR", "run.json or other run metadata as JSON text; NULL when absent"),
        ("input_bytes", "BIGINT", "bytes of trace files read (compressed size on disk)"),
        ("ingest_seconds", "DOUBLE", "wall time of the ingest of this run"),
        ("ingested_at", "TIMESTAMP", "when the run was ingested (UTC)"),
        ("tool_version", "VARCHAR", "tracecal version that wrote the run"),
        (
            "events_dir",
            "VARCHAR",
            "folder of the run's event files (one Parquet file per rank), relative to the database's folder",
        ),
    ),
)

RANKS = Table(
    "ranks",
    "One row per rank trace of a run.",
    _cols(
        ("run_id", "VARCHAR", "run identifier"),
        ("rank", "INTEGER", "global rank"),
        ("file", "VARCHAR", "trace file path"),
        ("file_bytes", "BIGINT", "size of the file on disk"),
        ("host", "VARCHAR", "host name when the trace records it"),
        ("pid", "BIGINT", "main process id of the rank"),
        ("device_name", "VARCHAR", "GPU name from deviceProperties / TARGET_INFO_GPU; NULL on CPU runs"),
        ("backend", "VARCHAR", "distributed backend (nccl, gloo) from distributedInfo"),
        ("schema_era", "VARCHAR", "Kineto category era: 2021, 2022, 2024 (or nsys)"),
        ("rank_source", "VARCHAR", "where the rank came from: distributedInfo, path, nsys_order, ..."),
        ("events", "BIGINT", "complete events stored for this rank"),
        ("kernels", "BIGINT", "GPU kernels among them"),
        (
            "clock_offset_ns",
            "BIGINT",
            "offset added to this rank's timestamps to align clocks (docs/decode.md#clock-alignment)",
        ),
        ("clock_residual_ns", "BIGINT", "median absolute residual of matched collective ends after alignment"),
    ),
)

EVENTS = Table(
    "events",
    "Every complete (ph=X) event of every rank, normalised across Kineto eras and Nsight exports. "
    "A view of the Parquet files in the event store beside the database (one per rank; docs/parsing.md#event-store).",
    _cols(
        ("run_id", "VARCHAR", "run identifier"),
        ("rank", "INTEGER", "global rank"),
        ("event_id", "BIGINT", "index of the event within its rank (file order); unique per run and rank"),
        (
            "kind",
            "VARCHAR",
            "normalised kind: cpu_op, python_function, user_annotation, "
            "gpu_user_annotation, cuda_runtime, cuda_driver, kernel, memcpy, memset, nvtx, sync, trace, other",
        ),
        ("category", "VARCHAR", "raw category as written by the profiler (cat, or the Nsight table)"),
        ("name", "VARCHAR", "event name (operator, kernel, runtime call, annotation)"),
        ("ts_ns", "BIGINT", "start, absolute nanoseconds on the rank's own clock"),
        ("dur_ns", "BIGINT", "duration in nanoseconds; NULL when the trace has none"),
        ("pid", "BIGINT", "process id (CPU events) or device id (GPU events); NULL when not numeric"),
        ("tid", "BIGINT", "thread id (CPU events) or stream id (GPU events); NULL when not numeric"),
        ("device", "INTEGER", "GPU index for GPU activity"),
        ("stream", "INTEGER", "GPU stream for GPU activity"),
        ("correlation", "BIGINT", "CUPTI correlation id linking a runtime call to the GPU activity it launched"),
        ("external_id", "BIGINT", "External id linking a runtime call to the CPU operator that issued it"),
        ("sequence_number", "BIGINT", "autograd sequence number (forward op and its backward share it)"),
        ("fwd_thread_id", "BIGINT", "for backward ops: the thread that ran the forward op"),
        ("input_dims", "VARCHAR", "Input Dims as JSON text, e.g. [[8,512],[512,1024]]"),
        ("input_types", "VARCHAR", 'Input type as JSON text, e.g. ["float","float"]'),
        ("concrete_inputs", "VARCHAR", "Concrete Inputs as JSON text (scalar arguments)"),
        ("bytes", "BIGINT", "bytes copied or set (memcpy, memset); message size of an Nsight NCCL NVTX range"),
        ("grid", "VARCHAR", "kernel grid dims as JSON text"),
        ("block", "VARCHAR", "kernel block dims as JSON text"),
        ("coll_name", "VARCHAR", "Collective name arg (allreduce, send, ...) on record_param_comms/NCCL kernels"),
        ("in_msg_nelems", "BIGINT", "In msg nelems: elements sent by this rank"),
        ("out_msg_nelems", "BIGINT", "Out msg nelems: elements received by this rank"),
        ("group_size", "INTEGER", "Group size of the collective's process group"),
        ("coll_dtype", "VARCHAR", "dtype arg of the collective (Float, Half, BFloat16, ...)"),
        ("pg_name", "VARCHAR", "Process Group Name"),
        ("pg_desc", "VARCHAR", "Process Group Description"),
        ("pg_ranks", "VARCHAR", "Process Group Ranks as JSON text, e.g. [0,1]"),
        ("in_split_size", "VARCHAR", "In split size as JSON text (all_to_all)"),
        ("out_split_size", "VARCHAR", "Out split size as JSON text (all_to_all)"),
        ("global_rank_start", "INTEGER", "Global rank start of the group"),
        ("global_rank_stride", "INTEGER", "Global rank stride of the group"),
        ("coll_seq", "BIGINT", "per-collective sequence number / comms id when the trace records it"),
        ("src_rank", "INTEGER", "Src Rank arg of a point-to-point collective (the peer of a recv)"),
        ("dst_rank", "INTEGER", "Dst Rank arg of a point-to-point collective (the peer of a send)"),
    ),
)

OPERATORS = Table(
    "operators",
    "One row per GPU activity (kernel, memcpy, memset) in GPU traces, or per leaf CPU operator in "
    "CPU-only traces, linked to the runtime call and CPU operator that issued it and classified.",
    _cols(
        ("run_id", "VARCHAR", "run identifier"),
        ("rank", "INTEGER", "global rank"),
        ("event_id", "BIGINT", "events.event_id of the activity itself"),
        (
            "kind",
            "VARCHAR",
            "kernel, memcpy, memset, or cpu_op / user_annotation (CPU-only traces: leaf "
            "CPU operators and gloo:* work ranges)",
        ),
        ("name", "VARCHAR", "kernel / activity / operator name"),
        ("ts_ns", "BIGINT", "start, absolute ns on the rank's own clock"),
        ("dur_ns", "BIGINT", "duration in ns"),
        ("device", "INTEGER", "GPU index"),
        ("stream", "INTEGER", "GPU stream"),
        ("correlation", "BIGINT", "correlation id shared with the launching runtime call"),
        ("runtime_event_id", "BIGINT", "events.event_id of the launching runtime call; NULL when unlinked"),
        ("runtime_name", "VARCHAR", "launching runtime call (cudaLaunchKernel, ...)"),
        ("runtime_ts_ns", "BIGINT", "start of the launching runtime call"),
        ("runtime_dur_ns", "BIGINT", "duration of the launching runtime call"),
        ("cpu_tid", "BIGINT", "CPU thread of the runtime call / operator"),
        ("cpu_op_event_id", "BIGINT", "events.event_id of the innermost CPU operator; NULL when unlinked"),
        ("cpu_op_name", "VARCHAR", "innermost CPU operator (aten::mm, ...)"),
        ("cpu_op_ts_ns", "BIGINT", "start of the CPU operator"),
        ("cpu_op_dur_ns", "BIGINT", "duration of the CPU operator"),
        ("scope_name", "VARCHAR", "outermost framework scope enclosing the CPU operator (user annotation)"),
        ("input_dims", "VARCHAR", "Input Dims of the CPU operator as JSON text"),
        ("input_types", "VARCHAR", "Input type of the CPU operator as JSON text"),
        ("sequence_number", "BIGINT", "autograd sequence number of the CPU operator"),
        (
            "family",
            "VARCHAR",
            "op family (docs/decode.md#families): gemm, attention, softmax, norm, elementwise, "
            "embedding, loss, optimizer, memcpy, memset, comm, other",
        ),
        ("phase", "VARCHAR", "fwd, bwd, optimizer, other (docs/decode.md#phases)"),
        (
            "component",
            "VARCHAR",
            "compute_fwd, compute_bwd, optimizer, comm_tp, comm_dp, comm_pp, comm_ep, "
            "comm_other, memcpy, other (docs/decode.md#components)",
        ),
        ("iteration", "INTEGER", "iteration whose CPU window launched this activity; NULL when outside all"),
        (
            "link",
            "VARCHAR",
            "how the CPU operator was found: external_id (runtime call's External id), "
            "time (innermost cpu_op enclosing the runtime call on its thread), self (CPU-only traces), none",
        ),
        *SHAPE_COLUMNS,
    ),
)

COLLECTIVES = Table(
    "collectives",
    "One row per collective or point-to-point instance per rank, matched across ranks.",
    _cols(
        ("run_id", "VARCHAR", "run identifier"),
        ("rank", "INTEGER", "global rank"),
        ("event_id", "BIGINT", "events.event_id of the NCCL kernel (or gloo CPU op) of the instance"),
        (
            "name",
            "VARCHAR",
            "normalised collective: all_reduce, all_gather, reduce_scatter, all_to_all, "
            "broadcast, reduce, send, recv, barrier, other",
        ),
        ("ts_ns", "BIGINT", "start on the rank's own clock"),
        ("dur_ns", "BIGINT", "duration in ns"),
        ("aligned_ts_ns", "BIGINT", "start after clock alignment (ts_ns + ranks.clock_offset_ns)"),
        ("dtype", "VARCHAR", "element type"),
        ("pg_name", "VARCHAR", "process group name"),
        ("pg_ranks", "VARCHAR", "global ranks of the process group as JSON text"),
        ("peer", "INTEGER", "global rank of the peer (send/recv); NULL for collectives"),
        ("role", "VARCHAR", "group role: tp, dp, pp, ep, cp, unknown"),
        ("seq_in_group", "BIGINT", "order of this instance among the rank's collectives of the group"),
        ("match_id", "BIGINT", "shared by the same instance on every member rank; NULL when unmatched"),
        ("iteration", "INTEGER", "iteration the instance belongs to"),
        ("stream", "INTEGER", "GPU stream"),
        ("algbw_gbps", "DOUBLE", "algorithm bandwidth size_bytes / dur, GB/s (nccl-tests)"),
        ("busbw_gbps", "DOUBLE", "bus bandwidth algbw × busbw factor, GB/s (nccl-tests)"),
        *COMM_COLUMNS,
    ),
)

ITERATIONS = Table(
    "iterations",
    "One row per iteration per rank (ProfilerStep#N or --iteration-marker).",
    _cols(
        ("run_id", "VARCHAR", "run identifier"),
        ("rank", "INTEGER", "global rank"),
        ("iteration", "INTEGER", "iteration index (N of ProfilerStep#N, else the marker's order)"),
        ("marker", "VARCHAR", "name of the marker event, or NULL when the capture is one iteration"),
        ("cpu_start_ns", "BIGINT", "start of the marker on the CPU"),
        ("cpu_end_ns", "BIGINT", "end of the marker on the CPU"),
        ("gpu_start_ns", "BIGINT", "first GPU activity launched from this iteration; NULL without GPU work"),
        ("gpu_end_ns", "BIGINT", "end of the last GPU activity launched from this iteration"),
        ("aligned_start_ns", "BIGINT", "span start after clock alignment"),
        ("aligned_end_ns", "BIGINT", "span end after clock alignment"),
        ("dur_ns", "BIGINT", "iteration time: GPU span when there is GPU work, else CPU span"),
    ),
)

SAMPLES = Table(
    "samples",
    "Microbenchmark samples of compute operators and collectives, measured or imported, per cluster.",
    _cols(
        ("sample_id", "VARCHAR", "stable id: hash of cluster, source, op, direction and features"),
        ("cluster", "VARCHAR", "cluster name (perlmutter, vista, local, ...)"),
        ("device_name", "VARCHAR", "GPU or CPU name"),
        ("host", "VARCHAR", "host that took the sample"),
        ("family", "VARCHAR", "op family (docs/decode.md#families) or comm"),
        ("op", "VARCHAR", "source op: published name (linear1, allreduce) or sampled op (aten::mm, all_reduce)"),
        ("direction", "VARCHAR", "fwd or bwd (comm: fwd)"),
        ("tp", "INTEGER", "tensor-parallel size the shape was derived for (published samples), else NULL"),
        *SHAPE_COLUMNS,
        ("collective", "VARCHAR", "collective name for comm samples"),
        *COMM_COLUMNS,
        (
            "pooled",
            "BOOLEAN",
            "comm sample from a file pooling several topologies (gpumodeling25 NCCL "
            "files without the _N_G suffix; the same rows also come from the per-topology files); "
            "false for per-topology files, NULL for compute and measured samples",
        ),
        ("median_ns", "DOUBLE", "median duration over repeats, ns"),
        ("min_ns", "DOUBLE", "minimum duration, ns"),
        ("iqr_ns", "DOUBLE", "inter-quartile range of durations, ns; NULL when one repeat"),
        ("repeats", "INTEGER", "timed repeats (n)"),
        ("quality_flag", "VARCHAR", "NULL when plausible, else the reason the sample is excluded"),
        ("source", "VARCHAR", "sampler or imported:<format>"),
        ("source_file", "VARCHAR", "file the sample came from (imported) or config (sampled)"),
        ("params_json", "VARCHAR", "the op's raw parameters as JSON text (e.g. the published CSV row)"),
        ("torch_version", "VARCHAR", "torch version of the sampler"),
        ("cuda_version", "VARCHAR", "CUDA version; NULL on CPU"),
        ("nccl_version", "VARCHAR", "NCCL version; NULL on CPU / gloo"),
        ("sampled_at", "TIMESTAMP", "when the sample was taken or imported (UTC)"),
        (
            "timing",
            "VARCHAR",
            "how a measured sample was timed (docs/samples.md#timing): perf_counter, profiler, cuda_burst, "
            "cuda_events; NULL for imported published samples",
        ),
    ),
)

MODELS = Table(
    "models",
    "Calibrated regressors per cluster, family, direction (and op / topology), with validation errors.",
    _cols(
        ("model_id", "VARCHAR", "artifact id (directory name in the model store)"),
        ("cluster", "VARCHAR", "cluster name"),
        ("family", "VARCHAR", "op family or comm"),
        ("direction", "VARCHAR", "fwd or bwd"),
        ("op", "VARCHAR", "source op or collective the model serves; NULL when the whole family"),
        ("topology", "VARCHAR", "nodes x gpus_per_node for collectives; NULL otherwise"),
        (
            "model_kind",
            "VARCHAR",
            "physical, random_forest, xgboost, blend (forest x booster), local (smoother "
            "along log size), local_forest (smoother x forest)",
        ),
        ("hyperparams_json", "VARCHAR", "chosen hyper-parameters as JSON text"),
        ("features_json", "VARCHAR", "feature column list as JSON text"),
        ("n_train", "INTEGER", "training samples"),
        ("n_test", "INTEGER", "hold-out samples"),
        ("n_excluded", "INTEGER", "samples excluded by quality flags"),
        ("mape", "DOUBLE", "hold-out mean absolute percentage error, %"),
        ("p50_ape", "DOUBLE", "hold-out median absolute percentage error, %"),
        ("p90_ape", "DOUBLE", "hold-out 90th percentile absolute percentage error, %"),
        ("max_ape", "DOUBLE", "hold-out maximum absolute percentage error, %"),
        ("published_mape", "DOUBLE", "the published system's hold-out error for the same op, %; NULL if unknown"),
        ("cv_mape", "DOUBLE", "k-fold cross-validated MAPE of the chosen model on the training rows, %"),
        ("noise_ape", "DOUBLE", "collectives: hold-out MAPE of a local median in size (replicate spread), %"),
        ("protocol", "VARCHAR", "hold-out split: published (GPUModeling25 80/20, random_state 42) or own"),
        (
            "status",
            "VARCHAR",
            "ok, or inconsistent: <why> (samples contradict themselves; model kept, "
            "flagged); groups with too few samples get no row",
        ),
        ("data_fingerprint", "VARCHAR", "hash of the training samples"),
        ("artifact_path", "VARCHAR", "directory of the stored artifact"),
        ("schema_version", "INTEGER", "artifact schema version"),
        ("created_at", "TIMESTAMP", "when the model was fitted (UTC)"),
    ),
)

PREDICTIONS = Table(
    "predictions",
    "Per operator of a replayed best iteration: measured and predicted duration and replayed times.",
    _cols(
        ("run_id", "VARCHAR", "run identifier"),
        ("cluster", "VARCHAR", "cluster whose models predicted (NULL in measured mode)"),
        ("mode", "VARCHAR", "measured, predicted, or scaled"),
        ("rank", "INTEGER", "global rank"),
        ("event_id", "BIGINT", "events.event_id of the operator"),
        ("family", "VARCHAR", "op family"),
        ("component", "VARCHAR", "component (docs/decode.md#components)"),
        ("measured_dur_ns", "BIGINT", "duration in the trace"),
        (
            "predicted_dur_ns",
            "BIGINT",
            "replayed duration (end − start; a collective member includes its wait for the last member)",
        ),
        ("duration_source", "VARCHAR", "model, measured (uncovered), or scale"),
        ("replay_start_ns", "BIGINT", "start in the replay, relative to the rank's replayed iteration start"),
        ("replay_end_ns", "BIGINT", "end in the replay, relative to the rank's replayed iteration start"),
        REPLAY_COLUMN,
        (
            "unexplained_ns",
            "BIGINT",
            "absorbed slack on the rank's critical path of the fitted replay just before this operator "
            "(0 in the dependency replay, which has none)",
        ),
    ),
)

COMPONENTS = Table(
    "components",
    "Per run, rank and component: measured vs predicted time of the best iteration and the error.",
    _cols(
        ("run_id", "VARCHAR", "run identifier"),
        ("cluster", "VARCHAR", "cluster whose models predicted (NULL in measured mode)"),
        ("mode", "VARCHAR", "measured, predicted, or scaled"),
        ("rank", "INTEGER", "global rank"),
        (
            "component",
            "VARCHAR",
            "compute_fwd, compute_bwd, optimizer, other (compute of unknown phase), comm_tp, "
            "comm_dp, comm_pp, comm_ep, comm_other, memcpy, idle, or iteration (the whole iteration)",
        ),
        (
            "measured_ns",
            "BIGINT",
            "measured time of the component in the best iteration: each instant counts once, "
            "for the first active component in the order above, so comm_* is exposed communication and the "
            "components of a rank add up to its iteration",
        ),
        ("predicted_ns", "BIGINT", "replayed time of the component (same accounting)"),
        ("error_pct", "DOUBLE", "(predicted − measured) / measured × 100; NULL when measured is 0"),
        ("covered_share", "DOUBLE", "share of the component's measured time predicted by a model (0–1)"),
        REPLAY_COLUMN,
        (
            "unexplained_ns",
            "BIGINT",
            "absorbed slack on the rank's critical path of the fitted replay landing before this component's "
            "operators (iteration: all of it); 0 in the dependency replay",
        ),
    ),
)

TABLES: tuple[Table, ...] = (
    RUNS,
    RANKS,
    OPERATORS,
    COLLECTIVES,
    ITERATIONS,
    SAMPLES,
    MODELS,
    PREDICTIONS,
    COMPONENTS,
)
"""All tables stored in the database file, in creation order. ``EVENTS`` is not among them: its rows
are Parquet files beside the database, read through a view of the same name and columns
(``tracecal.sql.event_store``)."""

RUN_TABLES: tuple[Table, ...] = tuple(t for t in TABLES if t.column_names[0] == "run_id")
"""Tables keyed by run_id: re-ingesting a run deletes its rows from all of them."""


# --- derived forms ---------------------------------------------------------------------------------

_ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP": pa.timestamp("us"),
}


def arrow_schema(table: Table) -> pa.Schema:
    """The Arrow schema a record batch must have to be appended to ``table``."""
    return pa.schema([pa.field(c.name, _ARROW_TYPES[c.sql_type]) for c in table.columns])


def polars_schema(columns: Table | Iterable[Column]) -> dict[str, pl.DataType]:
    """The polars schema of ``columns`` (a table's, or a column group such as ``SHAPE_COLUMNS``), in
    order: the one SQL -> polars type map, so frames built in Python match the stored table."""
    import polars as pl  # here, not at the top: ``tracecal --help`` and ``tracecal sql`` stay fast

    types: dict[str, pl.DataType] = {
        "VARCHAR": pl.Utf8(),
        "BIGINT": pl.Int64(),
        "INTEGER": pl.Int32(),
        "DOUBLE": pl.Float64(),
        "BOOLEAN": pl.Boolean(),
        "TIMESTAMP": pl.Datetime("us"),
    }
    cols = columns.columns if isinstance(columns, Table) else columns
    return {c.name: types[c.sql_type] for c in cols}


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal (single quotes doubled): for generated DDL and comments."""
    return "'" + text.replace("'", "''") + "'"


def ddl(table: Table) -> str:
    """CREATE TABLE plus COMMENT ON statements for one table (the generated .sql file's text)."""
    width = max(len(c.name) for c in table.columns)
    lines = [
        f"-- {table.name}: {table.doc}",
        "-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.",
        f"CREATE TABLE IF NOT EXISTS {table.name} (",
    ]
    body = [f"    {c.name.ljust(width)} {c.sql_type}" for c in table.columns]
    lines.append(",\n".join(body))
    lines.append(");")
    lines.append(f"COMMENT ON TABLE {table.name} IS {sql_string(table.doc)};")
    lines.extend(f"COMMENT ON COLUMN {table.name}.{c.name} IS {sql_string(c.doc)};" for c in table.columns)
    return "\n".join(lines) + "\n"


TABLES_DIR = Path(__file__).parent / "sql" / "tables"


def write_ddl_files(directory: Path = TABLES_DIR) -> list[Path]:
    """Regenerate ``tracecal/sql/tables/<table>.sql`` from this module."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for table in TABLES:
        path = directory / f"{table.name}.sql"
        path.write_text(ddl(table))
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write_ddl_files():
        sys.stdout.write(f"wrote {p}\n")

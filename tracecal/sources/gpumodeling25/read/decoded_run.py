"""A decoded GPT-NeoX run folder, as the published GPUModeling25 decoder leaves it (pure reading).

Layout (the run folder, or its job sub-folder)::

    <job>/{0,1,2}/{fwd,bwd,encoder_fwd,encoder_bwd,reduce_grads,optimizer_step}.csv   per-kernel tables
    <job>/best_batch_statistics/{0,1,2}/{pp_p2p,dp_allreduce,optimizer}.csv         best iteration's tables
    <job>/module_times_{average,min}.csv, <job>/best_batch/module_times_*.csv          measured module times
    <job>/best_batch/compares.csv                                                      published comparison
    <job>/*.log                                                                        the GPT-NeoX log

The kernel tables of the three rank folders and the log with its argument dump are required
(``missing_parts`` names each one absent); ``best_batch_statistics/`` is not: ``reconstruct`` takes
the activation sends from elsewhere and says where.

Rank folders 0, 1 and 2 are the head (global rank 0), the first rank of the second pipeline stage and
the last rank. A kernel table has one row per kernel position of a module: the outermost and innermost
CPU operator with their External id and ``Input Dims``, the kernel name, its mean duration over the
aligned occurrences and ``kernel_overhead(us)``, which is the summed gap before the kernel divided by
3 rather than by the number of occurrences N (a bug of the published decoder). ``gap_us`` here undoes
it, with N from the run itself (see ``occurrences``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from tracecal.errors import InputNotFoundError, TraceFormatError
from tracecal.ingest.input_dims import is_dims_text
from tracecal.sources.gpumodeling25.read.folder import decoded_job_dir
from tracecal.sources.gpumodeling25.read.neox_log import NeoxLog, parse_neox_log
from tracecal.sources.gpumodeling25.read.tables import read_compares, read_module_times

POSITIONS = ("head", "middle", "tail")
"""What the rank folders 0, 1 and 2 hold: the first, a middle and the last pipeline stage."""

RUN_TABLES = ("fwd", "bwd", "encoder_fwd", "encoder_bwd", "reduce_grads", "optimizer_step")
"""Per-kernel tables of every traced rank, decoded from the whole trace."""

BEST_BATCH_TABLES = ("pp_p2p", "dp_allreduce", "optimizer")
"""Per-kernel tables of the best iteration (``pp_p2p`` is absent on the last stage)."""

TABLE_COLUMNS = (
    "cpu_op_0",
    "cpu_op_0_id",
    "cpu_op_0_input_dim",
    "cpu_op_1",
    "cpu_op_1_id",
    "cpu_op_1_input_dim",
    "kernel",
    "kernel_id",
    "kernel_overhead(us)",
    "kernel_dur(us)",
)
"""Header of every per-kernel table."""

_NONE = "None"
"""How the published decoder writes a missing CPU operator."""


def activity_kind(kernel: pl.Expr) -> pl.Expr:
    """``memcpy``, ``memset`` or ``kernel`` from a GPU activity's name as the tables write it."""
    return (
        pl.when(kernel.str.starts_with("Memcpy"))
        .then(pl.lit("memcpy"))
        .when(kernel.str.starts_with("Memset"))
        .then(pl.lit("memset"))
        .otherwise(pl.lit("kernel"))
    )


def read_kernel_table(path: Path) -> pl.DataFrame:
    """One per-kernel table: ``outer_op, outer_id, outer_dims, inner_op, inner_id, inner_dims, kernel,
    overhead_us, dur_us`` in row order (CPU columns NULL where the decoder found none).

    Raises:
        InputNotFoundError: the file is missing.
        TraceFormatError: the header, a number or an Input Dims cell is not what the published decoder
            writes (the file, line and column named).
    """
    if not path.is_file():
        raise InputNotFoundError(f"{path}: missing; a decoded run needs every rank folder's kernel tables")
    try:
        raw = pl.read_csv(path, infer_schema=False)
    except (pl.exceptions.ComputeError, pl.exceptions.NoDataError) as exc:
        raise TraceFormatError(f"{path}: not a readable CSV ({exc})") from exc
    if tuple(raw.columns) != TABLE_COLUMNS:
        raise TraceFormatError(
            f"{path}: header {raw.columns} is not a decoded kernel table ({', '.join(TABLE_COLUMNS)})"
        )
    for column in ("cpu_op_0_input_dim", "cpu_op_1_input_dim"):
        _check_dims_cells(path, raw, column)

    def text(col: str) -> pl.Expr:
        return pl.when(pl.col(col).is_in([_NONE, ""])).then(None).otherwise(pl.col(col))

    try:
        return raw.select(
            text("cpu_op_0").alias("outer_op"),
            text("cpu_op_0_id").cast(pl.Int64).alias("outer_id"),
            text("cpu_op_0_input_dim").alias("outer_dims"),
            text("cpu_op_1").alias("inner_op"),
            text("cpu_op_1_id").cast(pl.Int64).alias("inner_id"),
            text("cpu_op_1_input_dim").alias("inner_dims"),
            pl.col("kernel"),
            pl.col("kernel_overhead(us)").cast(pl.Float64).alias("overhead_us"),
            pl.col("kernel_dur(us)").cast(pl.Float64).alias("dur_us"),
        )
    except pl.exceptions.InvalidOperationError as exc:
        raise TraceFormatError(f"{path}: a number column holds text ({exc})") from exc


def _check_dims_cells(path: Path, raw: pl.DataFrame, column: str) -> None:
    """Every Input Dims cell of ``column`` is empty, ``None`` or JSON text of a list (``input_dims``).

    Raises:
        TraceFormatError: naming the file, the line (the header is line 1) and the column of the first
            cell that is not.
    """
    cells = raw.get_column(column)
    bad = {v for v in cells.unique().to_list() if v not in (None, "", _NONE) and not is_dims_text(v)}
    if not bad:
        return
    row = next(i for i, v in enumerate(cells.to_list()) if v in bad)
    cell = str(cells[row])
    shown = cell if len(cell) <= 60 else cell[:57] + "..."
    raise TraceFormatError(
        f"{path}: line {row + 2}, column {column}: {shown!r} is not an Input Dims list (JSON such as "
        "[[4, 2048], []]); the table is damaged: decode the run again or repair the cell"
    )


def occurrences(table: pl.DataFrame, span_us: float | None, most: int) -> float:
    """How many module occurrences N the table averages over, so that the true mean gap is
    ``overhead_us · 3 / N``.

    The published decoder keeps only the occurrences of maximal length, so N is at most ``most`` (the
    occurrences the traced iterations hold) and may be smaller. When the module's measured mean span is
    known and longer than its kernels, N is the value that makes kernels plus gaps fill that span;
    otherwise ``most``.
    """
    kernels = float(table["dur_us"].sum())
    overhead = float(table["overhead_us"].clip(lower_bound=0).sum())
    if span_us is None or span_us <= kernels or overhead <= 0:
        return float(most)
    return min(float(most), max(1.0, 3.0 * overhead / (span_us - kernels)))


@dataclass(frozen=True)
class DecodedRun:
    """Everything a decoded run folder holds that tracecal uses.

    Attributes:
        job_dir: the job folder.
        log_path: the GPT-NeoX log.
        log: the log, parsed.
        tables: ``tables[position][name]`` kernel tables of ``RUN_TABLES`` per traced rank.
        best_batch: ``best_batch[position][name]`` tables of ``BEST_BATCH_TABLES`` (where present).
        rank_extras: ``rank_extras[position][name]`` tables of ``BEST_BATCH_TABLES`` that a decoder
            version wrote into the rank folder itself (where present).
        module_times: measured module times, µs per position: ``run_level_average``, ``run_level_min``,
            ``best_batch_average``, ``best_batch_min``, ``best_batch_average_old`` (where present).
        compares: the published ``best_batch/compares.csv`` (empty when absent).
    """

    job_dir: Path
    log_path: Path
    log: NeoxLog
    tables: dict[str, dict[str, pl.DataFrame]]
    best_batch: dict[str, dict[str, pl.DataFrame]]
    rank_extras: dict[str, dict[str, pl.DataFrame]] = field(default_factory=dict)
    module_times: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    compares: dict[str, dict] = field(default_factory=dict)

    @property
    def has_best_batch_statistics(self) -> bool:
        return (self.job_dir / BEST_BATCH_DIR).is_dir()


BEST_BATCH_DIR = "best_batch_statistics"
"""The folder of the best iteration's tables (``BEST_BATCH_TABLES`` per rank folder)."""


def missing_parts(job: Path) -> tuple[list[str], NeoxLog | None]:
    """What a decoded run's job folder lacks for a rebuild, each part named as the user would look for
    it (kernel tables by rank folder, the log, the log's argument dump), and the parsed log when it
    has one. ``best_batch_statistics/`` is not required (``reconstruct`` says what replaces it)."""
    missing: list[str] = []
    for i, _ in enumerate(POSITIONS):
        folder = job / str(i)
        absent = [f"{name}.csv" for name in RUN_TABLES if not (folder / f"{name}.csv").is_file()]
        if len(absent) == len(RUN_TABLES):
            missing.append(f"kernel tables {i}/ ({', '.join(RUN_TABLES)}.csv)")
        elif absent:
            missing.append(f"kernel tables {', '.join(f'{i}/{a}' for a in absent)}")
    logs = sorted(job.glob("*.log"))
    log = None
    if not logs:
        missing.append("the GPT-NeoX log (*.log, the training stdout with its argument dump)")
    else:
        try:
            log = parse_neox_log(logs[0])
        except TraceFormatError as exc:
            missing.append(f"the log's argument dump ({logs[0].name}: {exc.args[0].split(': ', 1)[-1]})")
    return missing, log


def read_decoded_run(path: Path) -> DecodedRun:
    """Read a decoded run folder (``path`` is the run folder or its job folder).

    Raises:
        InputNotFoundError: not a decoded run, or kernel tables, the log or its argument dump are
            missing (every missing part named in one line).
        TraceFormatError: a table is malformed.
    """
    job = decoded_job_dir(path)
    if job is None:
        raise InputNotFoundError(
            f"{path}: not a decoded GPT-NeoX run (expected rank folders 0/ 1/ 2/ of kernel tables, "
            "best_batch_statistics/ and a *.log in it or its job folder)"
        )
    missing, log = missing_parts(job)
    if missing or log is None:
        raise InputNotFoundError(f"{job}: this decoded GPT-NeoX run cannot be rebuilt; missing: {'; '.join(missing)}")
    logs = sorted(job.glob("*.log"))
    tables = {
        pos: {name: read_kernel_table(job / str(i) / f"{name}.csv") for name in RUN_TABLES}
        for i, pos in enumerate(POSITIONS)
    }
    best = {pos: _optional_tables(job / BEST_BATCH_DIR / str(i)) for i, pos in enumerate(POSITIONS)}
    extras = {pos: _optional_tables(job / str(i)) for i, pos in enumerate(POSITIONS)}
    sources = {
        "run_level_average": job / "module_times_average.csv",
        "run_level_min": job / "module_times_min.csv",
        "best_batch_average": job / "best_batch" / "module_times_average.csv",
        "best_batch_min": job / "best_batch" / "module_times_min.csv",
        "best_batch_average_old": job / "best_batch" / "module_times_average_old.csv",
    }
    module_times = {key: read_module_times(p) for key, p in sources.items() if p.is_file()}
    compares_path = job / "best_batch" / "compares.csv"
    compares = read_compares(compares_path) if compares_path.is_file() else {}
    return DecodedRun(job, logs[0], log, tables, best, extras, module_times, compares)


def _optional_tables(folder: Path) -> dict[str, pl.DataFrame]:
    """The ``BEST_BATCH_TABLES`` present in ``folder``."""
    return {n: read_kernel_table(folder / f"{n}.csv") for n in BEST_BATCH_TABLES if (folder / f"{n}.csv").is_file()}

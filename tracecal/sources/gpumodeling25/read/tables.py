"""The GPUModeling25 decoder's module-time tables, and Table 8 from a run's stored metadata.

``module_times_average.csv`` / ``module_times_min.csv`` have the columns ``module,function,gpu_runtime(us)``;
the last cell is a Python-list string with one value per traced rank (head, middle, tail stage), in µs,
where 0 means the target was not found on that rank. Pure reading: no DuckDB, no printing.
"""

from __future__ import annotations

import ast
import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracecal.errors import InputNotFoundError, TraceFormatError
from tracecal.sources.gpumodeling25.read.neox_log import NeoxLog, iteration_statistics

MODULE_TIMES_COLUMNS = ("module", "function", "gpu_runtime(us)")
#: the row that holds the pipeline engine's ``train_batch`` span; some files label it ``update``
TRAIN_BATCH_MODULES = ("train_batch", "update")
#: keys of ``runs.metadata_json`` for a decoded GPUModeling25 run
NEOX_LOG_KEY = "neox_log"
MODULE_TIMES_KEY = "run_level_module_times"


def _table_rows(path: Path, columns: tuple[str, ...], expected: str) -> list[tuple[int, list[str]]]:
    """The non-blank data rows of a small published CSV, with their line numbers, after checking that
    the file exists, its header is ``columns`` and every row has one cell per column.

    Raises:
        InputNotFoundError: ``path`` does not exist (``expected`` says where such a table lives).
        TraceFormatError: the header or a row's cell count is wrong.
    """
    if not path.is_file():
        raise InputNotFoundError(f"no table at {path}; expected {expected}")
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if not rows or tuple(cell.strip() for cell in rows[0]) != columns:
        header = ",".join(rows[0]) if rows else "nothing"
        raise TraceFormatError(f"{path}: header is {header!r}, expected {','.join(columns)!r}")
    out = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            raise TraceFormatError(f"{path}:{line}: {len(row)} cells, expected {len(columns)}")
        out.append((line, row))
    return out


def read_module_times(path: Path) -> dict[str, list[float]]:
    """Read a ``module,function,gpu_runtime(us)`` table: module name -> µs per traced rank.

    A module listed twice (the tables were written in append mode) keeps its first row.

    Raises:
        InputNotFoundError: ``path`` does not exist.
        TraceFormatError: the header is not ``module,function,gpu_runtime(us)`` or a cell is not a list
            of numbers (the message names file, line and cell).
    """
    times: dict[str, list[float]] = {}
    rows = _table_rows(path, MODULE_TIMES_COLUMNS, "<job>/module_times_average.csv or _min.csv")
    for line, row in rows:
        module, _, cell = (c.strip() for c in row)
        values = _number_list(cell)
        if values is None:
            raise TraceFormatError(f"{path}:{line}: gpu_runtime(us) {cell!r} is not a list of numbers")
        times.setdefault(module, values)
    return times


def train_batch_us(module_times: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    """The ``train_batch`` rows of ``{"average": read_module_times(...), "min": read_module_times(...)}``.

    Returns ``{"average": [µs per rank], "min": [µs per rank]}`` with only the tables that have the row;
    the row is ``train_batch``, else ``update`` (the min tables label the ``train_batch`` span so).
    """
    out: dict[str, list[float]] = {}
    for table in ("average", "min"):
        rows = module_times.get(table) or {}
        name = next((n for n in TRAIN_BATCH_MODULES if n in rows), None)
        if name is not None:
            out[table] = [float(v) for v in rows[name]]
    return out


def table8_from_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`iteration_statistics` of a run from its ``runs.metadata_json`` (already ``json.loads``-ed).

    Uses ``metadata["neox_log"]`` (`NeoxLog.to_json`) and, where present,
    ``metadata["run_level_module_times"]`` (``{"average": {module: [µs]}, "min": {module: [µs]}}``).

    Raises:
        TraceFormatError: ``neox_log`` is missing or was stored by another version.
    """
    stored = metadata.get(NEOX_LOG_KEY)
    if not isinstance(stored, Mapping):
        raise TraceFormatError(f"run metadata has no {NEOX_LOG_KEY!r}; ingest the run with its GPT-NeoX log")
    log = NeoxLog.from_json(stored)
    module_times = metadata.get(MODULE_TIMES_KEY)
    fallback = train_batch_us(module_times) if isinstance(module_times, Mapping) else None
    return iteration_statistics(log, fallback)


def _number_list(cell: str) -> list[float] | None:
    try:
        value = ast.literal_eval(cell)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list | tuple):
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        return None
    return [float(v) for v in value]


COMPARES_COLUMNS = ("module", "measurement(us)", "prediction(us)", "error", "abs_mean_error")
"""Header of a run's ``best_batch/compares.csv`` (the published comparison)."""


def read_compares(path: Path) -> dict[str, dict[str, float | list[float]]]:
    """Read ``compares.csv``: module -> ``{"measurement", "prediction", "error", "abs_mean_error"}``.

    Measurement and prediction are µs, ``error`` the fraction (pred − meas) / meas; each is a scalar or a
    ``[head, middle, tail]`` list as written. ``module`` keeps the published prediction names (``update``
    is the optimizer step, ``1F1B_max_optimizer`` the iteration).

    Raises:
        InputNotFoundError: ``path`` does not exist.
        TraceFormatError: the header is not ``COMPARES_COLUMNS`` or a cell is not a number or list.
    """
    out: dict[str, dict[str, float | list[float]]] = {}
    for line, row in _table_rows(path, COMPARES_COLUMNS, "<job>/best_batch/compares.csv"):
        cells: dict[str, float | list[float]] = {}
        for key, cell in zip(("measurement", "prediction", "error", "abs_mean_error"), row[1:], strict=True):
            values = _number_list(cell.strip())
            if values is None:
                raise TraceFormatError(f"{path}:{line}: {key} {cell!r} is not a number or list of numbers")
            # a list cell stays a per-stage list, a bare number stays a scalar
            cells[key] = values if cell.strip().startswith("[") else values[0]
        out[row[0].strip()] = cells
    return out

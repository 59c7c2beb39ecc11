"""Readers of the small result tables a decoded GPT-NeoX run folder carries next to its traces.

``best_batch/module_times_{average,min,average_old}.csv`` hold one measured module time per row
(``module,function,gpu_runtime(us)``, the last a Python-list string ``[head, middle, tail]`` in µs, 0
where the module was not found on that rank); ``best_batch/compares.csv`` holds the published
comparison (``module,measurement(us),prediction(us),error,abs_mean_error``, each value a scalar or a
3-list; ``error`` is a fraction). Values are returned as written: a 0 stays 0, because the published
rules that consume these tables treat 0 as "not found" and callers must see exactly what was scored.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tracecal.errors import InputNotFoundError, TraceFormatError

MODULE_TIMES_COLUMNS = ("module", "function", "gpu_runtime(us)")
"""Header of a ``module_times_*.csv`` file."""

COMPARES_COLUMNS = ("module", "measurement(us)", "prediction(us)", "error", "abs_mean_error")
"""Header of a ``compares.csv`` file."""


def _rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    path = Path(path)
    if not path.is_file():
        raise InputNotFoundError(f"{path}: no such file (expected a decoded run's best_batch table)")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if tuple(reader.fieldnames or ()) != columns:
            raise TraceFormatError(f"{path}: header {reader.fieldnames} is not {list(columns)}")
        return list(reader)


def _value(text: str, path: Path, row: int, column: str) -> float | list[float]:
    """A cell holding a number or a JSON-compatible list of numbers (the tables' Python reprs are)."""
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise TraceFormatError(f"{path}: row {row} column {column!r}: {text!r} is not a number or list") from exc
    if isinstance(parsed, list) and all(isinstance(v, int | float) for v in parsed):
        return [float(v) for v in parsed]
    if isinstance(parsed, int | float) and not isinstance(parsed, bool):
        return float(parsed)
    raise TraceFormatError(f"{path}: row {row} column {column!r}: {text!r} is not a number or list")


def read_module_times(path: Path) -> dict[str, list[float]]:
    """``module_times_*.csv`` -> ``{module: [head, middle, tail]}`` in µs (0 = not found on that rank).

    A module written twice (the producer appends) must carry the same values both times.
    Raises InputNotFoundError for a missing file, TraceFormatError for a bad header or cell.
    """
    path = Path(path)
    out: dict[str, list[float]] = {}
    for i, row in enumerate(_rows(path, MODULE_TIMES_COLUMNS), start=2):
        value = _value(row["gpu_runtime(us)"], path, i, "gpu_runtime(us)")
        if not isinstance(value, list):
            raise TraceFormatError(f"{path}: row {i}: gpu_runtime(us) {value!r} is not a per-rank list")
        module = row["module"]
        if module in out and out[module] != value:
            raise TraceFormatError(f"{path}: module {module!r} appears twice with different values")
        out[module] = value
    return out


def read_compares(path: Path) -> dict[str, dict[str, float | list[float]]]:
    """``compares.csv`` -> ``{module: {"measurement", "prediction", "error", "abs_mean_error"}}``.

    Measurement and prediction are µs, ``error`` is the fraction (pred - meas) / meas, each a scalar or
    a ``[head, middle, tail]`` list as written. ``module`` keeps the published prediction names
    (``update`` is the optimizer step, ``1F1B_max_optimizer`` the iteration).
    """
    path = Path(path)
    out: dict[str, dict[str, float | list[float]]] = {}
    for i, row in enumerate(_rows(path, COMPARES_COLUMNS), start=2):
        out[row["module"]] = {
            "measurement": _value(row["measurement(us)"], path, i, "measurement(us)"),
            "prediction": _value(row["prediction(us)"], path, i, "prediction(us)"),
            "error": _value(row["error"], path, i, "error"),
            "abs_mean_error": _value(row["abs_mean_error"], path, i, "abs_mean_error"),
        }
    return out

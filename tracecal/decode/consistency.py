"""Consistency of CPU operators with the GPU kernels a table pairs them with.

Tables that align operators with kernels by position (the published GPUModeling25 decoder keeps the
first occurrence's names and averages kernel durations position by position) can pair an operator
with another operator's kernel when occurrences differ in length. Such a row carries a shape that did
not produce its duration: it must not be fitted on or validated against. Pure functions, no I/O.

``misaligned_ops(frame) -> pl.Series`` flags a row when

- the family of its CPU operator (``families.family_of``'s CPU-op rule) and the family of its kernel
  name (the kernel-name rule) are both known and differ, e.g. ``aten::addmm`` carrying a
  ``vectorized_layer_norm_kernel``; or
- the operator's ``io_bytes`` (``shape_features.shape_row`` of its name, Input Dims and Input type) over the
  kernel's duration exceeds ``MAX_BANDWIDTH_BYTES_PER_S``: no GPU moves that much, so the kernel did
  not do that operator's work, e.g. an ``aten::sum`` over [2048, 4, 5120] whose kernel would have had
  to move 28 TB/s.
"""

from __future__ import annotations

import orjson
import polars as pl

from tracecal.decode.families import cpu_op_family, kernel_families
from tracecal.decode.shape_features import shape_row

MAX_BANDWIDTH_BYTES_PER_S = 10e12
"""Ceiling of the bandwidth an operator may need from its kernel: twice the fastest HBM of current
GPUs (about 5 TB/s on H200/B200-class parts), so a row above it is impossible, not merely fast."""

LOWER_BOUND_TYPE = "unsigned char"
"""Element type assumed when a row has no Input type: one byte, the smallest, so the bytes (and the
bandwidth a row needs) are a lower bound and a missing type never flags a row on its own."""

COLUMNS = ("cpu_op_name", "input_dims", "input_types", "kernel_name", "dur_ns")
"""Columns ``misaligned_ops`` reads."""


def _io_bytes(name: str | None, dims: str | None, types: str | None) -> float | None:
    """``shape_row``'s ``io_bytes``; without types, one byte per element (``LOWER_BOUND_TYPE``)."""
    if not name or not dims:
        return None
    if types is None:
        try:
            arguments = orjson.loads(dims)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(arguments, list):
            return None
        types = orjson.dumps([LOWER_BOUND_TYPE] * len(arguments)).decode()
    return shape_row(name, dims, types)["io_bytes"]


def misaligned_ops(frame: pl.DataFrame, *, max_bandwidth: float = MAX_BANDWIDTH_BYTES_PER_S) -> pl.Series:
    """Which rows pair a CPU operator with a kernel that cannot be its own (bool per row, in order).

    Args:
        frame: one row per kernel with ``cpu_op_name`` (innermost CPU operator, null when unlinked),
            ``input_dims`` / ``input_types`` (Kineto ``Input Dims`` / ``Input type`` as JSON text,
            null when absent), ``kernel_name`` (the GPU kernel's name) and ``dur_ns`` (the kernel's
            duration, ns). Other columns are ignored.
        max_bandwidth: bytes per second above which a row's operator could not have run in its
            kernel's time (``MAX_BANDWIDTH_BYTES_PER_S``).

    Returns:
        Boolean Series ``misaligned``, one value per row of ``frame``: true where the operator's
        family and the kernel's family are both known and differ, or where the operator's
        ``io_bytes`` / ``dur_ns`` exceeds ``max_bandwidth``; false where either cannot be judged
        (no CPU operator, an unclassified kernel, no shape, no duration).

    Raises:
        ValueError: a column of ``COLUMNS`` is missing.
    """
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"misaligned_ops needs columns {', '.join(COLUMNS)}; missing {', '.join(missing)}")
    keys = ["cpu_op_name", "input_dims", "input_types", "kernel_name"]
    rows = frame.select(*(pl.col(c).cast(pl.Utf8) for c in keys), pl.col("dur_ns").cast(pl.Float64))
    # operators repeat a few dozen signatures: judge each distinct one once and join back
    distinct = rows.select(keys).unique(maintain_order=True)
    names, dims, types, kernels = (s.to_list() for s in distinct.get_columns())
    table = distinct.with_columns(
        pl.Series("_cpu", [cpu_op_family(n) for n in names], dtype=pl.Utf8),
        pl.Series("_kernel", kernel_families(kernels), dtype=pl.Utf8),
        pl.Series("_io", [_io_bytes(*r) for r in zip(names, dims, types, strict=True)], dtype=pl.Float64),
    )
    clash = pl.col("_cpu").is_not_null() & pl.col("_kernel").is_not_null() & (pl.col("_cpu") != pl.col("_kernel"))
    too_fast = (pl.col("dur_ns") > 0) & (pl.col("_io") / (pl.col("dur_ns") / 1e9) > max_bandwidth)
    return (
        rows.join(table, on=keys, how="left", nulls_equal=True, maintain_order="left")
        .select((clash.fill_null(False) | too_fast.fill_null(False)).alias("misaligned"))
        .get_column("misaligned")
    )

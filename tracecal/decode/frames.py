"""Frame building without a query plan: series in, frame out (pure).

Every eager frame operation of polars (``select``, ``with_columns``, ``filter``) plans and runs a
query first, a fixed cost whatever the rows, which dominates decoding a small trace. Where an
operation only places, renames or filters whole columns, building the frame from its series avoids
that cost: these helpers do that.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import polars as pl
from polars.datatypes import DataType, DataTypeClass


def nulls(schema: Mapping[str, DataType | DataTypeClass], n: int) -> list[pl.Series]:
    """``n`` NULLs per column of ``schema`` (series built from lists: no query plan)."""
    return [pl.Series(name, [None] * n, dtype=dtype) for name, dtype in schema.items()]


def with_series(frame: pl.DataFrame, *series: pl.Series) -> pl.DataFrame:
    """``frame.with_columns(*series)`` without a plan: a series replaces the column of its name in
    place, or is appended (each of ``frame``'s height)."""
    columns = {name: frame.get_column(name) for name in frame.columns}
    for s in series:
        columns[s.name] = s
    return pl.DataFrame(list(columns.values()))


def picked(frame: pl.DataFrame, columns: dict[str, str], where: pl.Series | None = None) -> pl.DataFrame:
    """``frame.filter(where).select(pl.col(source).alias(name) ...)`` without a plan: the
    ``{source: name}`` columns, of the rows where ``where`` is true (NULL counts as false; None: all)."""
    return pl.DataFrame(
        [
            (frame.get_column(src) if where is None else frame.get_column(src).filter(where)).alias(dst)
            for src, dst in columns.items()
        ]
    )


def taken(frame: pl.DataFrame, rows: np.ndarray) -> pl.DataFrame:
    """The rows of ``frame`` at ``rows`` (-1: a row of NULLs): one frame take (a series ``gather``
    plans a query per column)."""
    if (rows >= 0).all():
        return frame[rows]
    return frame.vstack(pl.DataFrame(nulls(frame.schema, 1)))[np.where(rows >= 0, rows, frame.height)]


def coalesce(first: pl.Series, then: pl.Series) -> pl.Series:
    """``pl.coalesce(first, then)`` of two series of one type, without a plan (named as ``first``)."""
    return first.zip_with(first.is_not_null(), then) if first.null_count() else first


def sort_by(frame: pl.DataFrame, first: str, then: str) -> pl.DataFrame:
    """``frame.sort(first, then)`` of two integer columns, without a plan when it is sorted already
    (rows of equal keys then keep their order, which a sort may change)."""
    a, b = frame.get_column(first), frame.get_column(then)
    if a.null_count() or b.null_count():
        return frame.sort(first, then)
    x, y = a.cast(pl.Int64).to_numpy(), b.cast(pl.Int64).to_numpy()
    in_order = (x[1:] > x[:-1]) | ((x[1:] == x[:-1]) & (y[1:] >= y[:-1]))
    return frame if in_order.all() else frame.sort(first, then)

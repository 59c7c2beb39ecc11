"""Running the named queries in ``tracecal/sql/queries/``.

Every multi-line statement tracecal runs on the database is a documented ``.sql`` file there, named
for what it returns (``predict_activities``, ``samples_read``, ...). ``query_text(name)`` gives its
text (read once per process by ``tracecal.sql.registry``, the one module that reads ``.sql`` files);
``query_file(con, name, params)`` runs it (an Arrow table) and ``query_frame`` too (a polars frame).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import duckdb
import polars as pl
import pyarrow as pa

from tracecal.sql.connection import query_arrow
from tracecal.sql.registry import query_text

__all__ = ["query_file", "query_frame", "query_text"]


def query_file(
    con: duckdb.DuckDBPyConnection, name: str, params: Sequence[Any] | Mapping[str, Any] | None = None
) -> pa.Table:
    """The rows of ``queries/<name>.sql`` run with ``params`` (positional or named), as an Arrow table."""
    return query_arrow(con, query_text(name), params)


def query_frame(
    con: duckdb.DuckDBPyConnection, name: str, params: Sequence[Any] | Mapping[str, Any] | None = None
) -> pl.DataFrame:
    """The rows of ``queries/<name>.sql`` run with ``params``, as a polars frame."""
    return cast(pl.DataFrame, pl.from_arrow(query_file(con, name, params)))

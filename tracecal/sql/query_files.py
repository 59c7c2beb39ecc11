"""The named queries in ``tracecal/sql/queries/``: the one place that reads them.

Every multi-line statement tracecal runs on the database is a documented ``.sql`` file there, named
for what it returns (``predict_activities``, ``samples_read``, ...). ``query_text(name)`` gives its
text, read once per process; ``query_file(con, name, params)`` runs it (an Arrow table) and
``query_frame`` too (a polars frame). Only this module knows where
the files live (a test checks that no other module reaches into the directory).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, cast

import duckdb
import polars as pl
import pyarrow as pa

from tracecal.sql.connection import query_arrow

QUERIES_DIR = Path(__file__).parent / "queries"


@cache
def query_text(name: str) -> str:
    """The text of ``queries/<name>.sql`` (``name`` without the suffix), read once per process.

    Raises:
        KeyError: there is no such query file (a programming error: the names are fixed in code).
    """
    path = QUERIES_DIR / f"{name}.sql"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in QUERIES_DIR.glob("*.sql")))
        raise KeyError(f"no query {name!r} in {QUERIES_DIR} (known: {known})")
    return path.read_text()


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

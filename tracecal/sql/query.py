"""Running user SQL and listing runs: the library side of ``tracecal sql`` and ``tracecal runs``, and the
one reader of a run's stored metadata (``runs.metadata_json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from tracecal.errors import TracecalError
from tracecal.sql.connection import query_arrow
from tracecal.sql.query_files import query_file

OUTPUT_FORMATS = ("table", "csv", "json", "parquet")


class QueryError(TracecalError):
    """The SQL given to ``tracecal sql`` failed to parse or run, or tried to write without --write."""


def run_query(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run one or more statements; return the result of the last one as an Arrow table.

    Raises:
        QueryError: DuckDB rejected the SQL (DuckDB's whole message: its hints and the position).
    """
    statements = [s for s in _split_statements(con, sql)]
    if not statements:
        raise QueryError("no SQL statement given")
    try:
        for statement in statements[:-1]:
            con.execute(statement)
        return query_arrow(con, statements[-1])
    except duckdb.Error as exc:
        message = str(exc).rstrip()  # all of it: the candidate bindings, the LINE 1: ... ^ pointer
        if "read-only" in message.lower():
            raise QueryError(f"{message} (pass --write to allow changes)") from exc
        raise QueryError(message) from exc


def _split_statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[str]:
    try:
        return [s.query for s in con.extract_statements(sql)]
    except duckdb.Error as exc:
        raise QueryError(str(exc).rstrip()) from exc


def write_result(table: pa.Table, fmt: str, output: Path) -> None:
    """Write a query result to ``output`` as csv, json (array of objects) or parquet."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt == "csv":
        pacsv.write_csv(table, output)
    elif fmt == "parquet":
        pq.write_table(table, output)
    elif fmt == "json":
        output.write_text(result_as_json(table))
    else:
        raise QueryError(f"cannot write format {fmt!r} to a file; use csv, json or parquet")


def result_as_json(table: pa.Table) -> str:
    """Rows as a JSON array of objects (timestamps as ISO strings)."""
    import msgspec

    return msgspec.json.encode(table.to_pylist()).decode() + "\n"


def result_as_csv(table: pa.Table) -> str:
    import io

    import pyarrow.csv as pacsv

    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    return sink.getvalue().decode()


def list_runs(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """One row per run: ranks, events, span of the capture, format and source path."""
    return query_file(con, "runs_overview")


def run_metadata(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """A run's ``runs.metadata_json`` (its ``run.json``, or what its source stored), as a dict; empty when
    the run is not there or has none."""
    row = con.execute("SELECT metadata_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return parse_run_metadata(row[0] if row else None)


def parse_run_metadata(text: str | None) -> dict[str, Any]:
    """``runs.metadata_json`` text as a dict: empty when NULL, not JSON, or not a JSON object (the column
    holds what a run folder's ``run.json`` said, and a reader must not fail on it)."""
    if not text:
        return {}
    try:
        metadata = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return metadata if isinstance(metadata, dict) else {}

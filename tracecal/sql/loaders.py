"""Writing a run's rows and reading its events back: the statements the pipeline runs on DuckDB.

Every function takes an open connection and runs inside the caller's transaction (none opens or
commits one). They know the tables (``tracecal.schema``) and nothing of traces or decoding: the
pipeline (``tracecal.pipeline``) passes Arrow tables, polars frames and plain values.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa

from tracecal.errors import RunNotFoundError
from tracecal.schema import COLLECTIVES, ITERATIONS, OPERATORS, RUN_TABLES, Table
from tracecal.sql.connection import query_arrow
from tracecal.sql.query_files import query_file, query_text

DERIVED_TABLES = (OPERATORS, COLLECTIVES, ITERATIONS)
"""The tables decode writes for a run (replaced when the run is decoded again)."""


def delete_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Delete the run's rows from every run-keyed table; one query when the run is new (the usual
    case: a DELETE per table costs about as much as parsing a small rank)."""
    names = [table.name for table in RUN_TABLES]
    probe = " UNION ALL ".join(f"(SELECT 1 FROM {name} WHERE run_id = $run_id LIMIT 1)" for name in names)
    if con.execute(f"SELECT count(*) FROM ({probe})", {"run_id": run_id}).fetchall() == [(0,)]:  # names from schema
        return
    for name in names:
        con.execute(f"DELETE FROM {name} WHERE run_id = ?", [run_id])  # name from schema


def insert_operators_file(con: duckdb.DuckDBPyConnection, path: Path, run_id: str) -> None:
    """Insert operators a worker decoded into a Parquet file (``OPERATORS`` columns), for ``run_id``."""
    con.execute(
        "INSERT INTO operators BY NAME SELECT * REPLACE ($run_id AS run_id) FROM read_parquet($path)",
        {"run_id": run_id, "path": str(path)},
    )


def delete_rank_operators(con: duckdb.DuckDBPyConnection, run_id: str, ranks: list[int]) -> None:
    """Delete the operators of some ranks of a run (a worker decoded them with a layout the run's
    ranks then contradicted: the loader decodes them again)."""
    con.execute("DELETE FROM operators WHERE run_id = ? AND list_contains(?, rank)", [run_id, ranks])


def shard_as_events(con: duckdb.DuckDBPyConnection, path: Path, rank: int) -> None:
    """Make ``events`` of ``con`` (a worker's own in-memory database) a view of one rank's Parquet
    shard, its ``rank`` set, so that decode's queries read the shard as they read a stored run
    (``SHARD_RUN_ID`` is its run id)."""
    con.execute("SET VARIABLE tracecal_shard = ?", [str(path)])
    con.execute("SET VARIABLE tracecal_rank = ?", [rank])
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW events AS SELECT * REPLACE ('{SHARD_RUN_ID}' AS run_id, "
        "getvariable('tracecal_rank')::INTEGER AS rank) FROM read_parquet(getvariable('tracecal_shard'))"
    )


SHARD_RUN_ID = "shard"
"""The run id of the one rank ``shard_as_events`` shows."""


VALUES_MAX_ROWS = 4
"""``insert_rows`` inserts up to this many rows with a ``VALUES`` statement, more from Arrow."""


def insert_rows(con: duckdb.DuckDBPyConnection, table_name: str, schema: pa.Schema, rows: list[dict[str, Any]]) -> None:
    """Insert rows with one statement; ``schema`` names the columns (a row lacking one stores NULL).

    A few rows (the run, a small run's ranks) go as one parameterised ``VALUES`` statement, whose
    values DuckDB casts to the columns' types; more as an Arrow table of ``schema`` read by DuckDB's
    replacement scan, whose cost hardly grows with the rows while
    ``VALUES`` costs grow with every row."""
    if not rows:
        return
    names = schema.names
    if len(rows) > VALUES_MAX_ROWS:
        _tracecal_rows = pa.Table.from_pylist(rows, schema=schema)  # read by the replacement scan
        con.execute(f"INSERT INTO {table_name} BY NAME SELECT * FROM _tracecal_rows")  # name from schema
        return
    row_sql = "(" + ", ".join("?" * len(names)) + ")"
    values = ", ".join([row_sql] * len(rows))
    params = [row.get(name) for row in rows for name in names]
    con.execute(f"INSERT INTO {table_name} ({', '.join(names)}) VALUES {values}", params)  # names from schema


def insert_frame(con: duckdb.DuckDBPyConnection, table: Table, frame: pl.DataFrame, run_id: str | None = None) -> None:
    """Insert ``frame``'s rows of ``table``; ``run_id`` given: for that run, filled in Arrow (no frame
    operation), else the frame's own ``run_id`` column.

    The Arrow table is built column by column from the frame's series (a ``select`` plans a query)
    and handed over uncast: the ``INSERT`` casts each column to the table's type (the frames hold
    the same values in wider or differently encoded types: int64 ranks, large strings), which
    costs less than casting 45 columns in Arrow first.
    DuckDB reads it by replacement scan (a local Arrow table named in the statement): one statement,
    where a relation (``from_arrow(...).insert_into``) binds it twice.
    """
    if frame.height == 0:
        return
    columns = [
        pa.repeat(run_id, frame.height) if run_id is not None and c == "run_id" else frame.get_column(c).to_arrow()
        for c in table.column_names
    ]
    _tracecal_decoded_rows = pa.table(columns, names=table.column_names)  # read by the statement
    con.execute(f"INSERT INTO {table.name} SELECT * FROM _tracecal_decoded_rows")  # name from schema


def set_ingest_seconds(con: duckdb.DuckDBPyConnection, run_id: str, seconds: float) -> None:
    """Record the wall time of the run's whole ingest in ``runs.ingest_seconds``."""
    con.execute("UPDATE runs SET ingest_seconds = ? WHERE run_id = ?", [seconds, run_id])


def mark_run(con: duckdb.DuckDBPyConnection, run_id: str, marker: str) -> tuple[int | None, ...]:
    """Record the iteration marker in the run's ``runs`` row and return the row's
    ``(world_size, pp, tp, dp, nodes, gpus_per_node)``: one ``UPDATE ... RETURNING``.

    Raises:
        RunNotFoundError: the run is not in the database.
    """
    row = con.execute(
        "UPDATE runs SET iteration_marker = $2 WHERE run_id = $1 "
        "RETURNING world_size, pp, tp, dp, nodes, gpus_per_node",
        [run_id, marker],
    ).fetchall()
    if not row:
        raise RunNotFoundError(f"run {run_id!r} is not in the database; list runs with: tracecal runs")
    return tuple(row[0])


def delete_derived_rows(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Delete the run's rows of ``operators``, ``collectives`` and ``iterations``."""
    for table in DERIVED_TABLES:
        con.execute(f"DELETE FROM {table.name} WHERE run_id = ?", [run_id])  # name from schema


def event_counts(con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[int, int]]:
    """``(rank, events)`` of every rank of the run with stored events, by rank."""
    return [
        (int(rank), int(n))
        for rank, n in con.execute(
            "SELECT rank, count(*) FROM events WHERE run_id = ? GROUP BY rank ORDER BY rank", [run_id]
        ).fetchall()
    ]


def read_events(con: duckdb.DuckDBPyConnection, run_id: str, columns: Sequence[str], first: int, last: int) -> pa.Table:
    """The ``columns`` of the run's events of ranks ``first`` to ``last`` (inclusive), unsorted
    (DuckDB's ORDER BY costs more than the rest of the read; the caller sorts)."""
    return query_arrow(
        con,
        f"SELECT {', '.join(columns)} FROM events WHERE run_id = ? AND rank BETWEEN ? AND ?",  # names from schema
        [run_id, first, last],
    )


def set_clock_offsets(
    con: duckdb.DuckDBPyConnection, run_id: str, ranks: list[int], offsets_ns: list[int], residuals_ns: list[int]
) -> None:
    """Set ``ranks.clock_offset_ns`` and ``clock_residual_ns`` of the given ranks.

    One statement for all ranks, because each statement has a fixed cost and a run can have
    hundreds of ranks; the offsets are bound as lists (no register/unregister round trips). One rank
    is bound as values, because the unnest-and-join plan costs more than it saves there.
    """
    if len(ranks) == 1:
        con.execute(
            "UPDATE ranks SET clock_offset_ns = $3::BIGINT, clock_residual_ns = $4::BIGINT "
            "WHERE run_id = $1 AND rank = $2::INTEGER",
            [run_id, ranks[0], offsets_ns[0], residuals_ns[0]],
        )
    else:
        con.execute(
            "UPDATE ranks SET clock_offset_ns = o.clock_offset_ns, clock_residual_ns = o.clock_residual_ns "
            "FROM (SELECT unnest($2::INTEGER[]) AS rank, unnest($3::BIGINT[]) AS clock_offset_ns, "
            "unnest($4::BIGINT[]) AS clock_residual_ns) o WHERE ranks.run_id = $1 AND ranks.rank = o.rank",
            [run_id, ranks, offsets_ns, residuals_ns],
        )


ONE_THREAD_MIN_ROWS = 4_000
"""Inserts of at least this many rows run with DuckDB on one thread (``OneThreadForLargeInserts``)."""


class OneThreadForLargeInserts:
    """DuckDB on one thread for a run's inserts of ``ONE_THREAD_MIN_ROWS`` or more rows, the previous
    setting restored at the end of the run (after decode, whose inserts of operators, collectives and
    iterations then also run on one thread). With more threads an INSERT from Arrow costs more CPU,
    even from a single record batch that one thread scans. Changing the setting has its own cost
    (DuckDB stops its thread pool), more than it saves on a small insert, so a run whose inserts are
    all small (a small single-file run) leaves it alone; it is changed once per run at most."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.restore_to: int | None = None  # the setting before the run, once read

    def before_insert(self, rows: int) -> None:
        if rows < ONE_THREAD_MIN_ROWS or self.restore_to is not None:
            return
        self.restore_to = int(self.con.execute("SELECT current_setting('threads')").fetchall()[0][0])
        if self.restore_to != 1:
            self.con.execute("SET threads = 1")

    def restore(self) -> None:
        """Put the run's previous setting back (nothing to do if no insert changed it)."""
        if self.restore_to is not None and self.restore_to != 1:
            self.con.execute(f"SET threads = {self.restore_to}")
        self.restore_to = None


def event_names(con: duckdb.DuckDBPyConnection, run_id: str, rank: int, kinds: Sequence[str]) -> list[str]:
    """The distinct names of one rank's events of ``kinds`` (``queries/decode_window_marker_names.sql``)."""
    rows = con.execute(query_text("decode_window_marker_names"), {"run_id": run_id, "rank": rank, "kinds": list(kinds)})
    return [name for (name,) in rows.fetchall()]


def named_events(
    con: duckdb.DuckDBPyConnection, run_id: str, rank: int, kinds: Sequence[str], names: Sequence[str]
) -> pa.Table:
    """One rank's events of ``kinds`` named one of ``names``, with ``end_ns``
    (``queries/decode_window_markers.sql``)."""
    params = {"run_id": run_id, "rank": rank, "kinds": list(kinds), "names": list(names)}
    return query_file(con, "decode_window_markers", params)


def window_times(
    con: duckdb.DuckDBPyConnection, run_id: str, rank: int, batch_rows: int = 1_000_000
) -> pa.RecordBatchReader:
    """One rank's ``ts_ns``, every event's, read ``batch_rows`` at a time (``queries/decode_window_times.sql``)."""
    params = {"run_id": run_id, "rank": rank}
    reader: pa.RecordBatchReader = con.sql(query_text("decode_window_times"), params=params).to_arrow_reader(batch_rows)
    return reader


def launch_lags(
    con: duckdb.DuckDBPyConnection, run_id: str, rank: int, gpu_kinds: Sequence[str], runtime_kinds: Sequence[str]
) -> tuple[int, int | None, int | None]:
    """``(gpu_events, min_lag_ns, max_lag_ns)`` of one rank: its GPU activities and how far they
    start after their runtime call (``queries/decode_window_launch_lags.sql``)."""
    params = {"run_id": run_id, "rank": rank, "gpu_kinds": list(gpu_kinds), "runtime_kinds": list(runtime_kinds)}
    gpu_events, min_lag, max_lag = con.execute(query_text("decode_window_launch_lags"), params).fetchall()[0]
    return int(gpu_events), min_lag, max_lag


def window_intervals(
    con: duckdb.DuckDBPyConnection, run_id: str, rank: int, gpu_kinds: Sequence[str], batch_rows: int = 1_000_000
) -> pa.RecordBatchReader:
    """One rank's CPU-side intervals (``event_id``, ``ts_ns``, ``end_ns``), read ``batch_rows`` at a
    time (``queries/decode_window_intervals.sql``)."""
    params = {"run_id": run_id, "rank": rank, "gpu_kinds": list(gpu_kinds)}
    relation = con.sql(query_text("decode_window_intervals"), params=params)
    reader: pa.RecordBatchReader = relation.to_arrow_reader(batch_rows)
    return reader


def events_by_id(
    con: duckdb.DuckDBPyConnection, run_id: str, rank: int, columns: Sequence[str], event_ids: Sequence[int]
) -> pa.Table:
    """The ``columns`` of some of one rank's events, by event id (``queries/decode_window_rows.sql``)."""
    params = {"run_id": run_id, "rank": rank, "columns": list(columns), "event_ids": list(event_ids)}
    return query_file(con, "decode_window_rows", params)


def read_window_events(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    rank: int,
    columns: Sequence[str],
    kinds: tuple[Sequence[str], Sequence[str]],
    bounds: dict[str, int | None],
) -> pa.Table:
    """The ``columns`` of one decode window's events of a rank, unsorted
    (``queries/decode_window_events.sql``).

    Args:
        kinds: the GPU activity kinds and the runtime-call kinds.
        bounds: ``lo``, ``hi``, ``gpu_lo``, ``gpu_hi``, ``runtime_lo``, ``runtime_hi`` (None: open).
    """
    gpu_kinds, runtime_kinds = kinds
    params = {
        "run_id": run_id,
        "rank": rank,
        "columns": list(columns),
        "gpu_kinds": list(gpu_kinds),
        "runtime_kinds": list(runtime_kinds),
        **bounds,
    }
    return query_file(con, "decode_window_events", params)

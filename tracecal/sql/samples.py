"""The sample store: microbenchmark samples in the ``samples`` table, per cluster.

Samplers and importers hand over Arrow tables shaped like ``arrow_schema(SAMPLES)``; this module
upserts them by ``sample_id`` in one transaction, reads them back as polars frames for calibration,
lists what is stored, and moves samples between machines as Parquet files.

``sample_id`` is a stable hash of what identifies a measurement (cluster, source, op, direction and
its features), so re-importing a file or re-running a sampler replaces rows instead of duplicating
them, and a resumable sampler can skip the points whose ids already exist.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracecal import __version__
from tracecal.errors import InputNotFoundError, SampleError
from tracecal.schema import SAMPLES, SAMPLES_FILE_VERSION, arrow_schema
from tracecal.sql.connection import NEW_ROWS, query_arrow, replace_rows
from tracecal.sql.query_files import query_file

REQUIRED_COLUMNS = ("sample_id", "cluster", "family", "op", "direction", "source")
"""Columns a sample row must have non-NULL; every other column may be NULL (missing, never 0)."""

PARQUET_META_TABLE = b"tracecal.table"
PARQUET_META_SCHEMA = b"tracecal.schema_version"
PARQUET_META_VERSION = b"tracecal.version"


def _canonical(value: Any) -> Any:
    """Make equal feature values hash equally: 4096.0 and 4096 are the same shape."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        return repr(value)
    if isinstance(value, int):
        return value
    return str(value)


def sample_id(cluster: str, source: str, op: str, direction: str, features: Mapping[str, Any]) -> str:
    """Stable 24-hex-digit id of one measurement point.

    ``features`` holds whatever else identifies the point (shape columns, comm columns, and for
    imported rows the source file name and row index, so duplicated rows stay distinct). Key order
    does not matter; integral floats hash like ints.
    """
    payload = [cluster, source, op, direction, sorted((str(k), _canonical(v)) for k, v in features.items())]
    return hashlib.blake2b(msgspec.json.encode(payload), digest_size=12).hexdigest()


def conform_samples(table: pa.Table, origin: str = "sample batch") -> pa.Table:
    """Return ``table`` with exactly the ``samples`` columns, in order, with the schema's types.

    Columns the batch lacks are added as NULL. Raises SampleError (naming ``origin``) on columns the
    table does not have, values that cannot be cast, NULLs in ``REQUIRED_COLUMNS`` or duplicate ids.
    """
    schema = arrow_schema(SAMPLES)
    unknown = [c for c in table.column_names if c not in schema.names]
    if unknown:
        raise SampleError(
            f"{origin}: columns {', '.join(unknown)} are not in the samples table "
            "(see tracecal/schema.py SAMPLES for the columns a sample may have)"
        )
    repeated = sorted({c for c in table.column_names if table.column_names.count(c) > 1})
    if repeated:
        raise SampleError(f"{origin}: columns {', '.join(repeated)} appear more than once")
    columns = []
    for field in schema:
        if field.name in table.column_names:
            column = table.column(field.name)
            try:
                columns.append(column.cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SampleError(
                    f"{origin}: column {field.name} ({column.type}) cannot be stored as {field.type}: "
                    f"{str(exc).splitlines()[0]}"
                ) from exc
        else:
            columns.append(pa.nulls(table.num_rows, type=field.type))
    conformed = pa.Table.from_arrays(columns, schema=schema)
    for name in REQUIRED_COLUMNS:
        nulls = conformed.column(name).null_count
        if nulls:
            raise SampleError(f"{origin}: {nulls} rows have no {name}; every sample needs one")
    ids = conformed.column("sample_id")
    if pc.count_distinct(ids).as_py() != conformed.num_rows:
        raise SampleError(f"{origin}: duplicate sample_id values; ids must identify one measurement each")
    return conformed


def write_samples(con: duckdb.DuckDBPyConnection, table: pa.Table, origin: str = "sample batch") -> int:
    """Upsert samples by ``sample_id`` in one transaction; return the rows written.

    ``table`` conforms to ``arrow_schema(SAMPLES)`` (missing columns become NULL, see
    ``conform_samples``). Rows whose ``sample_id`` is already stored are replaced. Either every
    row is written or none is. Must not be called inside an open transaction.

    Raises:
        SampleError: the batch does not conform (nothing is written).
    """
    conformed = conform_samples(table, origin)
    if conformed.num_rows == 0:
        return 0
    replace_rows(con, SAMPLES, conformed, where=f"sample_id IN (SELECT sample_id FROM {NEW_ROWS})")
    return conformed.num_rows


def clusters(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Clusters with at least one stored sample, sorted."""
    return [r[0] for r in con.execute("SELECT DISTINCT cluster FROM samples ORDER BY cluster").fetchall()]


def read_samples(
    con: duckdb.DuckDBPyConnection,
    cluster: str,
    family: str | None = None,
    direction: str | None = None,
    include_flagged: bool = True,
) -> pl.DataFrame:
    """The cluster's samples as a polars frame with the ``samples`` columns, ordered by family, op,
    direction and sample_id. ``family``/``direction`` filter when given; ``include_flagged=False``
    drops rows with a ``quality_flag``. A filter that matches nothing returns an empty frame.

    Raises:
        SampleError: the cluster has no samples at all (the message lists the clusters that do).
    """
    if con.execute("SELECT count(*) FROM samples WHERE cluster = ?", [cluster]).fetchall() == [(0,)]:
        known = clusters(con)
        where = f"clusters with samples: {', '.join(known)}" if known else "the database has no samples"
        raise SampleError(
            f"no samples for cluster {cluster!r} ({where}); take some with `tracecal samples measure compute|comm` "
            "or `tracecal samples import DIR --cluster NAME --format gpumodeling25|parquet`"
        )
    table = query_file(con, "samples_read", [cluster, family, direction, include_flagged])
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def existing_sample_ids(con: duckdb.DuckDBPyConnection, cluster: str) -> set[str]:
    """Ids already stored for ``cluster``: a resumable sampler skips points whose id is in here."""
    rows = con.execute("SELECT sample_id FROM samples WHERE cluster = ?", [cluster]).fetchall()
    return {r[0] for r in rows}


def samples_overview(con: duckdb.DuckDBPyConnection, cluster: str | None = None) -> pa.Table:
    """Rows of the ``samples_overview`` view (per cluster, family, op, direction, source), optionally
    for one cluster."""
    return query_arrow(
        con,
        "SELECT * FROM samples_overview WHERE $1::VARCHAR IS NULL OR cluster = $1 "
        "ORDER BY cluster, family, op, direction, source",
        [cluster],
    )


def flag_counts(con: duckdb.DuckDBPyConnection, cluster: str | None = None) -> pa.Table:
    """Rows of the ``sample_flags`` view (flagged samples per cluster, reason, family and op)."""
    return query_arrow(
        con,
        "SELECT * FROM sample_flags WHERE $1::VARCHAR IS NULL OR cluster = $1 ORDER BY cluster, reason, family, op",
        [cluster],
    )


def write_samples_parquet(table: pa.Table, path: Path, origin: str | None = None) -> int:
    """Write sample rows to ``path`` as the Parquet file ``import_parquet`` reads; return the rows written.

    The rows are conformed first (``conform_samples``, errors naming ``origin``, the path by
    default). The file is written next to ``path`` and renamed into place, so a failure leaves no
    partial file. Its metadata records the table, the schema version and the tracecal version.

    Raises:
        SampleError: the rows do not conform (nothing is written).
    """
    import pyarrow.parquet as pq

    table = conform_samples(table, origin or str(path)).replace_schema_metadata(
        {
            PARQUET_META_TABLE: b"samples",
            PARQUET_META_SCHEMA: str(SAMPLES_FILE_VERSION).encode(),
            PARQUET_META_VERSION: __version__.encode(),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        pq.write_table(table, partial)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return table.num_rows


def export_parquet(con: duckdb.DuckDBPyConnection, output: Path, cluster: str | None = None) -> int:
    """Write the samples (of one cluster, or all) to ``output`` as Parquet (``write_samples_parquet``);
    return the rows written.

    Raises:
        SampleError: there are no samples to export.
    """
    table = query_arrow(
        con,
        "SELECT * FROM samples WHERE $1::VARCHAR IS NULL OR cluster = $1 ORDER BY cluster, sample_id",
        [cluster],
    )
    if table.num_rows == 0:
        what = f"cluster {cluster!r}" if cluster else "any cluster"
        raise SampleError(f"no samples of {what} to export; `tracecal samples list` shows what is stored")
    return write_samples_parquet(table, output)


def parquet_files(path: Path) -> list[Path]:
    """``path`` itself if it is a file, else the ``*.parquet`` files directly in the directory."""
    if not path.exists():
        raise InputNotFoundError(f"{path} does not exist; give a .parquet file written by `tracecal samples export`")
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.parquet"))
    if not files:
        raise InputNotFoundError(f"no *.parquet files in {path}; give a file written by `tracecal samples export`")
    return files


def read_parquet_samples(path: Path, cluster: str | None = None) -> pa.Table:
    """Read and conform the sample Parquet file(s) at ``path``; keep only ``cluster``'s rows if given.

    Raises:
        InputNotFoundError: the path does not exist or holds no Parquet files.
        SampleError: a file is not readable Parquet, is not a tracecal samples export of this
            schema version, or holds no samples of ``cluster``.
    """
    import pyarrow.parquet as pq

    tables = []
    for file in parquet_files(path):
        try:
            table = pq.read_table(file)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SampleError(f"{file} is not a readable Parquet file: {str(exc).splitlines()[0]}") from exc
        meta = table.schema.metadata or {}
        version = meta.get(PARQUET_META_SCHEMA)
        if version is not None and int(version) != SAMPLES_FILE_VERSION:
            raise SampleError(
                f"{file} was exported with samples schema version {int(version)}, this tracecal reads "
                f"{SAMPLES_FILE_VERSION}; export it again with this version"
            )
        table = with_timing_from_params(conform_samples(table.replace_schema_metadata(None), origin=str(file)))
        if cluster is not None:
            present = sorted(set(table.column("cluster").to_pylist()))
            table = table.filter(pc.equal(table.column("cluster"), cluster))
            if table.num_rows == 0:
                raise SampleError(
                    f"{file} holds no samples of cluster {cluster!r} (it holds: {', '.join(present)}); "
                    "pass one of those with --cluster, or omit --cluster to import all"
                )
        tables.append(table)
    combined = pa.concat_tables(tables)
    return conform_samples(combined, origin=str(path))


def with_timing_from_params(table: pa.Table) -> pa.Table:
    """``table`` with each NULL ``timing`` taken from ``params_json``'s ``timing`` key where it has one:
    files exported before the column existed keep saying how their samples were timed."""
    timing = table.column("timing")
    if timing.null_count == 0:
        return table
    filled = [
        method if method is not None else _params_timing(params)
        for method, params in zip(timing.to_pylist(), table.column("params_json").to_pylist(), strict=True)
    ]
    index = table.schema.get_field_index("timing")
    return table.set_column(index, table.schema.field(index), pa.array(filled, type=pa.string()))


def _params_timing(params_json: str | None) -> str | None:
    if not params_json:
        return None
    try:
        params = msgspec.json.decode(params_json)
    except msgspec.DecodeError:
        return None
    method = params.get("timing") if isinstance(params, dict) else None
    return method if isinstance(method, str) else None


def import_parquet(con: duckdb.DuckDBPyConnection, path: Path, cluster: str | None = None) -> int:
    """Import samples exported by ``export_parquet`` (a file, or a directory of them); upsert by
    ``sample_id`` in one transaction and return the rows written. See ``read_parquet_samples``."""
    return write_samples(con, read_parquet_samples(path, cluster), origin=str(path))

"""Read the activity tables of an Nsight export into Arrow, one reader per source table.

Each reader runs one SQL query on the export, fetches the rows in chunks and builds every Arrow
column with one ``pa.array`` call per column and chunk — no per-row dicts, no pandas. Names are
fetched as ``StringIds`` ids and resolved with one Arrow ``take`` against the strings the export
references (``Strings``), so a kernel name is materialised once, not once per launch. The result
conforms to ``ROW_SCHEMA``: the ``events`` columns an Nsight table can fill, plus ``proc`` (the
process id, used to split the file into ranks) and ``context`` (the CUDA context, used to find the
device of synchronisation records).

Units and conventions match the Kineto parser: times are int64 ns, GPU activity has ``pid`` = device
and ``tid`` = stream, CPU activity has the OS ``pid``/``tid`` decoded from ``globalTid``
(pid = (globalTid >> 24) & 0xFFFFFF, tid = globalTid & 0xFFFFFF), names are Kineto-style
(``Memcpy HtoD (Pageable -> Device)``, ``Memset (Device)``, ``cudaLaunchKernel`` without the
``_v7000`` API-version suffix, ``Event Sync``/``Stream Sync``/...). ``category`` is the source table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracecal.errors import TraceFormatError
from tracecal.sources.nsys.export import Export
from tracecal.sources.nsys.nvtx import classify_nvtx
from tracecal.sources.nsys.payload import nccl_range_fields, payload_schemas

FETCH_ROWS = 65_536
"""Rows per ``fetchmany`` chunk: bounds the Python objects alive at once."""

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"
GPU_TABLES = (KERNEL, MEMCPY, MEMSET)

NVTX_RANGE_TYPES = (59, 60, 70, 71)
"""``ENUM_NSYS_EVENT_TYPE`` ids of complete NVTX ranges (push/pop and start/end, NVTX and NVTXT).
Marks, domain creations and naming events have no duration and are not events in tracecal's sense."""

ROW_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("category", pa.string()),
        ("name", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("device", pa.int32()),
        ("stream", pa.int32()),
        ("correlation", pa.int64()),
        ("sequence_number", pa.int64()),
        ("input_dims", pa.string()),
        ("bytes", pa.int64()),
        ("grid", pa.string()),
        ("block", pa.string()),
        ("coll_name", pa.string()),
        ("pg_name", pa.string()),
        ("group_size", pa.int32()),
        ("src_rank", pa.int32()),
        ("dst_rank", pa.int32()),
        ("proc", pa.int64()),
        ("context", pa.int64()),
    ]
)

# CUPTI enums (stable across CUDA releases); Kineto prints the same abbreviations.
_COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}  # fmt: skip
_MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
             6: "Managed Static"}  # fmt: skip
_SYNC_KIND = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}

NO_ID = 4294967295
"""CUPTI's CUPTI_SYNCHRONIZATION_INVALID_VALUE: no stream / event for this record."""

_PID = "(({col} >> 24) & 16777215)"
_TID = "({col} & 16777215)"
_DUR = 'CASE WHEN {t}."end" >= {t}.start THEN {t}."end" - {t}.start END'


def _case(column: str, mapping: dict[int, str], default: str) -> str:
    """A SQL CASE over a constant mapping (constants only: nothing user-supplied is formatted in)."""
    whens = " ".join(f"WHEN {k} THEN '{v}'" for k, v in mapping.items())
    return f"CASE {column} {whens} ELSE '{default}' END"


def _fetch(export: Export, sql: str, params: tuple[object, ...], schema: pa.Schema) -> pa.Table:
    """Run ``sql`` and build ``schema``'s columns chunk by chunk, one ``pa.array`` per column."""
    cur = export.con.execute(sql, params)
    batches = []
    while rows := cur.fetchmany(FETCH_ROWS):
        columns = list(zip(*rows, strict=True))
        arrays = [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)]
        batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return pa.Table.from_batches(batches, schema=schema)


@dataclass(frozen=True)
class Strings:
    """The ``StringIds`` rows an export's activity tables reference, for vectorised lookup."""

    ids: pa.Array
    values: pa.Array

    @classmethod
    def load(cls, export: Export) -> Strings:
        refs = []
        for table, column in ((KERNEL, "demangledName"), (KERNEL, "shortName"), (RUNTIME, "nameId"),
                              (NVTX, "textId")):  # fmt: skip
            if column in export.columns(table):
                refs.append(f"SELECT {column} FROM {table}")
        if not refs:
            return cls(pa.array([], pa.int64()), pa.array([], pa.string()))
        sql = f"SELECT id, value FROM StringIds WHERE id IN ({' UNION '.join(refs)})"
        table = _fetch(export, sql, (), pa.schema([("id", pa.int64()), ("value", pa.string())]))
        return cls(table.column("id").combine_chunks(), table.column("value").combine_chunks())

    def lookup(self, ids: pa.ChunkedArray | pa.Array) -> pa.Array:
        """String of each id; null for null or unknown ids."""
        return pc.take(self.values, pc.index_in(ids, value_set=self.ids))


def _dims(raw: pa.Table, cols: tuple[str, str, str]) -> pa.Array:
    """Three integer columns -> compact JSON text ``[x,y,z]`` (Kineto's grid/block format)."""
    parts = [pc.cast(raw.column(c), pa.string()) for c in cols]
    return pc.binary_join_element_wise("[", parts[0], ",", parts[1], ",", parts[2], "]", "")


def _require(export: Export, table: str, columns: tuple[str, ...]) -> list[str]:
    present = export.columns(table)
    missing = [c for c in columns if c not in present]
    if missing:
        raise TraceFormatError(
            f"{export.path}: Nsight table {table} lacks column(s) {', '.join(missing)} "
            f"(export schema {export.schema_version}); re-export with a current nsys"
        )
    return present


def _finish(raw: pa.Table, const: dict[str, str | None]) -> pa.Table:
    """Add constant and missing columns and order them as ``ROW_SCHEMA``."""
    n = raw.num_rows
    cols = []
    for f in ROW_SCHEMA:
        if f.name in raw.column_names:
            cols.append(raw.column(f.name).cast(f.type))
        elif f.name in const:
            cols.append(pa.array([const[f.name]] * n, f.type) if n else pa.array([], f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.table(cols, schema=ROW_SCHEMA)


def read_kernels(export: Export, offset_ns: int, strings: Strings) -> pa.Table:
    """``CUPTI_ACTIVITY_KIND_KERNEL`` -> kind ``kernel`` (demangled name, grid/block as JSON)."""
    present = _require(export, KERNEL, ("start", "end", "deviceId", "streamId", "correlationId", "globalPid"))
    name_col = next((c for c in ("demangledName", "shortName") if c in present), None)
    if name_col is None:
        raise TraceFormatError(f"{export.path}: {KERNEL} has neither demangledName nor shortName; re-export")
    dims = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")
    has_dims = all(c in present for c in dims)
    dim_sql = ", ".join(f"k.{c}" if has_dims else "NULL" for c in dims)
    context = "k.contextId" if "contextId" in present else "NULL"
    sql = (
        f"SELECT k.start + ?, {_DUR.format(t='k')}, {_PID.format(col='k.globalPid')}, k.deviceId, k.streamId, "
        f"k.correlationId, k.{name_col}, {dim_sql}, {context} FROM {KERNEL} k"
    )
    schema = pa.schema([("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("proc", pa.int64()),
                        ("device", pa.int32()), ("stream", pa.int32()), ("correlation", pa.int64()),
                        ("name_id", pa.int64()), *[(c, pa.int64()) for c in dims],
                        ("context", pa.int64())])  # fmt: skip
    raw = _fetch(export, sql, (offset_ns,), schema)
    raw = raw.append_column("name", strings.lookup(raw.column("name_id")))
    raw = raw.append_column("grid", _dims(raw, ("gridX", "gridY", "gridZ")))
    raw = raw.append_column("block", _dims(raw, ("blockX", "blockY", "blockZ")))
    raw = raw.append_column("pid", pc.cast(raw.column("device"), pa.int64()))
    raw = raw.append_column("tid", pc.cast(raw.column("stream"), pa.int64()))
    return _finish(raw, {"kind": "kernel", "category": KERNEL})


def _read_memory(export: Export, table: str, kind: str, name_sql: str, offset_ns: int) -> pa.Table:
    present = _require(export, table, ("start", "end", "deviceId", "streamId", "correlationId", "globalPid"))
    nbytes = "m.bytes" if "bytes" in present else "NULL"
    context = "m.contextId" if "contextId" in present else "NULL"
    sql = (
        f"SELECT m.start + ?, {_DUR.format(t='m')}, {_PID.format(col='m.globalPid')}, m.deviceId, m.streamId, "
        f"m.correlationId, {name_sql}, {nbytes}, {context} FROM {table} m"
    )
    schema = pa.schema([("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("proc", pa.int64()),
                        ("device", pa.int32()), ("stream", pa.int32()), ("correlation", pa.int64()),
                        ("name", pa.string()), ("bytes", pa.int64()), ("context", pa.int64())])  # fmt: skip
    raw = _fetch(export, sql, (offset_ns,), schema)
    raw = raw.append_column("pid", pc.cast(raw.column("device"), pa.int64()))
    raw = raw.append_column("tid", pc.cast(raw.column("stream"), pa.int64()))
    return _finish(raw, {"kind": kind, "category": table})


def read_memcpy(export: Export, offset_ns: int, strings: Strings) -> pa.Table:
    """``CUPTI_ACTIVITY_KIND_MEMCPY`` -> kind ``memcpy`` named ``Memcpy HtoD (Pageable -> Device)``."""
    present = export.columns(MEMCPY)
    if all(c in present for c in ("copyKind", "srcKind", "dstKind")):
        name = (
            f"'Memcpy ' || {_case('m.copyKind', _COPY_KIND, 'Unknown')} || ' (' || "
            f"{_case('m.srcKind', _MEM_KIND, 'Unknown')} || ' -> ' || {_case('m.dstKind', _MEM_KIND, 'Unknown')} || ')'"
        )
    elif "copyKind" in present:
        name = f"'Memcpy ' || {_case('m.copyKind', _COPY_KIND, 'Unknown')}"
    else:
        name = "'Memcpy'"
    return _read_memory(export, MEMCPY, "memcpy", name, offset_ns)


def read_memset(export: Export, offset_ns: int, strings: Strings) -> pa.Table:
    """``CUPTI_ACTIVITY_KIND_MEMSET`` -> kind ``memset`` named ``Memset (Device)``."""
    kind_sql = _case("m.memKind", _MEM_KIND, "Unknown") if "memKind" in export.columns(MEMSET) else "'Unknown'"
    return _read_memory(export, MEMSET, "memset", f"'Memset (' || {kind_sql} || ')'", offset_ns)


def read_runtime(export: Export, offset_ns: int, strings: Strings) -> pa.Table:
    """``CUPTI_ACTIVITY_KIND_RUNTIME`` -> ``cuda_runtime`` (or ``cuda_driver`` for driver API calls).

    Nsight stores both APIs in one table; ``eventClass`` 1 (or a ``cu``-but-not-``cuda`` name in
    exports without it) marks the driver API, as Kineto's ``cuda_driver`` category does.
    """
    present = _require(export, RUNTIME, ("start", "end", "globalTid", "correlationId", "nameId"))
    event_class = "r.eventClass" if "eventClass" in present else "NULL"
    sql = (
        f"SELECT r.start + ?, {_DUR.format(t='r')}, {_PID.format(col='r.globalTid')}, "
        f"{_TID.format(col='r.globalTid')}, r.correlationId, r.nameId, {event_class} FROM {RUNTIME} r"
    )
    schema = pa.schema([("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()),
                        ("correlation", pa.int64()), ("name_id", pa.int64()), ("event_class", pa.int64())])  # fmt: skip
    raw = _fetch(export, sql, (offset_ns,), schema)
    # cudaLaunchKernel_v7000 -> cudaLaunchKernel: Kineto names carry no API-version suffix.
    name = pc.replace_substring_regex(strings.lookup(raw.column("name_id")), r"_v\d+$", "")
    by_name = pc.and_(pc.starts_with(name, "cu"), pc.invert(pc.starts_with(name, "cuda")))
    driver = pc.if_else(pc.is_valid(raw.column("event_class")), pc.equal(raw.column("event_class"), 1), by_name)
    kind = pc.if_else(pc.fill_null(driver, False), "cuda_driver", "cuda_runtime")
    raw = raw.append_column("name", name).append_column("kind", kind).append_column("proc", raw.column("pid"))
    return _finish(raw.drop_columns(["event_class"]), {"category": RUNTIME})


def read_sync(export: Export, offset_ns: int, strings: Strings) -> pa.Table:
    """``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` -> kind ``sync`` (``Event Sync``, ``Stream Sync``, ...).

    Event synchronisations carry no stream (CUPTI writes 0xFFFFFFFF): ``stream`` is null for them.
    The record's ``deviceId`` is not filled by CUPTI (it is 0 for every process in the shared export),
    so ``device`` is left null here and resolved from the CUDA context by the caller.
    """
    present = _require(export, SYNC, ("start", "end", "streamId", "correlationId", "globalPid"))
    kind_sql = _case("y.syncType", _SYNC_KIND, "Unknown Sync") if "syncType" in present else "'Unknown Sync'"
    context = "y.contextId" if "contextId" in present else "NULL"
    sql = (
        f"SELECT y.start + ?, {_DUR.format(t='y')}, {_PID.format(col='y.globalPid')}, NULLIF(y.streamId, {NO_ID}), "
        f"y.correlationId, {kind_sql}, {context} FROM {SYNC} y"
    )
    schema = pa.schema([("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("proc", pa.int64()),
                        ("stream", pa.int32()), ("correlation", pa.int64()), ("name", pa.string()),
                        ("context", pa.int64())])  # fmt: skip
    raw = _fetch(export, sql, (offset_ns,), schema)
    raw = raw.append_column("tid", pc.cast(raw.column("stream"), pa.int64()))
    return _finish(raw, {"kind": "sync", "category": SYNC})


def read_nvtx(export: Export, offset_ns: int, strings: Strings) -> pa.Table:
    """``NVTX_EVENTS`` ranges -> ``cpu_op`` / ``user_annotation`` (see ``nvtx``).

    The text is ``text`` when inline, else the ``StringIds`` string of ``textId``; ranges without an
    end (still open when capture stopped) keep a null duration.
    """
    present = _require(export, NVTX, ("start", "end", "eventType", "globalTid"))
    text = "n.text" if "text" in present else "NULL"
    text_id = "n.textId" if "textId" in present else "NULL"
    tid_col = "COALESCE(n.globalTid, n.endGlobalTid)" if "endGlobalTid" in present else "n.globalTid"
    types = ", ".join(str(t) for t in NVTX_RANGE_TYPES)
    schemas = payload_schemas(export) if "binaryData" in present else {}
    blob = "n.binaryData" if schemas else "NULL"
    sql = (
        f"SELECT n.start + ?, {_DUR.format(t='n')}, {_PID.format(col=tid_col)}, {_TID.format(col=tid_col)}, "
        f"{text}, {text_id}, {blob} FROM {NVTX} n WHERE n.eventType IN ({types})"
    )
    schema = pa.schema([("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()),
                        ("text", pa.string()), ("text_id", pa.int64()), ("blob", pa.binary())])  # fmt: skip
    raw = _fetch(export, sql, (offset_ns,), schema)
    text_arr = pc.coalesce(raw.column("text"), strings.lookup(raw.column("text_id")))
    classified = classify_nvtx(text_arr)
    raw = raw.drop_columns(["text", "text_id"])
    for f in classified.schema:
        raw = raw.append_column(f.name, classified.column(f.name))
    if raw.column("blob").null_count < raw.num_rows:
        raw = _with_payload_fields(raw, schemas)
    raw = raw.append_column("proc", raw.column("pid"))
    return _finish(raw, {"category": NVTX})


def _with_payload_fields(raw: pa.Table, schemas: dict) -> pa.Table:
    """Collective fields of the NCCL ranges that carry a payload blob (Python only over those rows)."""
    has = np.flatnonzero(pc.is_valid(raw.column("blob")).to_numpy(zero_copy_only=False))
    picked = pa.array(has, pa.int64())
    fields = nccl_range_fields(
        pc.take(raw.column("name"), picked).to_pylist(), pc.take(raw.column("blob"), picked).to_pylist(), schemas
    )
    n = raw.num_rows
    for name, values in fields.items():
        typ = ROW_SCHEMA.field(name).type
        column = pa.nulls(n, typ)
        if any(v is not None for v in values):
            full: list[object] = [None] * n
            for i, v in zip(has.tolist(), values, strict=True):
                full[i] = v
            column = pa.array(full, typ)
        raw = raw.append_column(name, column)
    return raw


READERS: dict[str, Callable[[Export, int, Strings], pa.Table]] = {
    KERNEL: read_kernels,
    MEMCPY: read_memcpy,
    MEMSET: read_memset,
    RUNTIME: read_runtime,
    SYNC: read_sync,
    NVTX: read_nvtx,
}
"""Source table -> reader, in the order events are read (tables absent from an export are skipped)."""

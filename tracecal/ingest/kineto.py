"""Kineto (torch.profiler) JSON -> one ``ParsedRank`` of Arrow record batches conforming to ``EVENTS``.

Decoding is typed end to end: msgspec decodes the document into ``msgspec.Raw`` slices per event
(no Python object per JSON value), then decodes events in batches into ``_Event`` Structs that
declare only the fields tracecal stores, and each batch becomes one Arrow record batch. Peak memory
is the uncompressed document plus one batch of Structs plus the Arrow columns, so a file needs a
small multiple of its own size whatever its event count.

Handled eras (SPEC §3.2): 2021 (``Operator``/``Runtime``/``Kernel`` categories, string tids such as
``"stream 7"``, lowercase ``Input dims`` / ``external id``, a top-level JSON array instead of an
object), 2022–23 (``cpu_op``/``cuda_runtime``/``kernel``, integer µs), 2024+ (float µs with
nanosecond precision, collective args on kernels, ``python_function``, ``cuda_driver``...).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracecal.errors import TraceFormatError
from tracecal.ingest.files import read_trace_bytes
from tracecal.ingest.trace import ParsedRank
from tracecal.schema import EVENTS, arrow_schema

BATCH_EVENTS = 200_000
"""Events decoded into Structs at a time: bounds the Python objects alive per worker."""

KIND_BY_CATEGORY: dict[str, str] = {
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "python_function": "python_function",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_runtime": "cuda_runtime",
    "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "cuda_sync": "sync",
    "Trace": "trace",
}
"""Raw Kineto category (every era) -> normalised ``events.kind``; anything else is ``other``."""

GPU_KINDS = frozenset({"kernel", "memcpy", "memset", "gpu_user_annotation", "sync"})
"""Kinds whose pid/tid are a device and a stream (device/stream columns are filled for them)."""

_ERA_2021 = frozenset({"Operator", "Runtime", "Kernel", "Memcpy", "Memset"})
_ERA_2024_FLOWS = frozenset({"ac2g", "fwdbwd"})
_TRAILING_INT = re.compile(r"(\d+)\s*$")


_Int = int | float | str | None
"""Integer args as written: some profilers write them as strings (ROCm ``"bytes": "128"``); they are
coerced after decoding, and values that are not integers become NULL."""


def _field(name: str) -> Any:
    return msgspec.field(default=None, name=name)


class _Args(msgspec.Struct):
    """The ``args`` keys tracecal keeps; every other key is skipped by the decoder."""

    external_id: _Int = _field("External id")
    external_id_2021: _Int = _field("external id")
    correlation: _Int = None
    device: _Int = None
    stream: _Int = None
    bytes: _Int = None
    sequence_number: _Int = _field("Sequence number")
    fwd_thread_id: _Int = _field("Fwd thread id")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_dims_2021: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")
    grid: msgspec.Raw = msgspec.Raw()
    block: msgspec.Raw = msgspec.Raw()
    coll_name: str | None = _field("Collective name")
    in_msg_nelems: _Int = _field("In msg nelems")
    out_msg_nelems: _Int = _field("Out msg nelems")
    group_size: _Int = _field("Group size")
    dtype: str | None = None
    pg_name: str | int | None = _field("Process Group Name")
    pg_desc: str | None = _field("Process Group Description")
    pg_ranks: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Process Group Ranks")
    in_split_size: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="In split size")
    out_split_size: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Out split size")
    global_rank_start: _Int = _field("Global rank start")
    global_rank_stride: _Int = _field("Global rank stride")
    seq: _Int = _field("Seq")
    comms_id: _Int = _field("Comms Id")
    src_rank: _Int = _field("Src Rank")
    dst_rank: _Int = _field("Dst Rank")


_NO_ARGS = _Args()


class _Event(msgspec.Struct):
    """One trace event; ``ph`` is the only key the Chrome trace format requires of every event."""

    ph: str
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: _Args | None = None


class _DistributedInfo(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: list[dict[str, Any]] | None = None
    nccl_version: str | None = None


class _DeviceProperties(msgspec.Struct):
    id: int | None = None
    name: str | None = None


_raw_list = msgspec.json.Decoder(list[msgspec.Raw])
_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
_event_batch = msgspec.json.Decoder(list[_Event])
_any = msgspec.json.Decoder()
_EVENTS_SCHEMA = arrow_schema(EVENTS)
_INT64 = pa.int64()
_INDEX_IN_PATH = re.compile(r"^\$\[(\d+)\]")


def parse_kineto_file(path: Path) -> ParsedRank:
    """Parse one Kineto JSON trace (``.json`` or ``.json.gz``) into a ``ParsedRank``.

    The rank is ``distributedInfo.rank`` when the trace has it, else None (discovery assigns it from
    the path). Times are absolute int64 ns on the rank's own clock: ``round(ts_µs × 1000)`` computed
    exactly for integer µs and without float truncation for float µs.

    Raises:
        TraceFormatError: corrupt gzip, invalid or truncated JSON, JSON that is not a Kineto trace,
            or a complete event without ``ts``/``name`` (the message names file, event index, key).
    """
    data = read_trace_bytes(path)
    source_bytes = len(data)
    header, raw_events = _split_document(path, data)
    batches = []
    categories: Counter[str] = Counter()
    float_ts = False
    for start in range(0, len(raw_events), BATCH_EVENTS):
        chunk = raw_events[start : start + BATCH_EVENTS]
        events = _decode_batch(path, chunk, start)
        categories.update(e.cat for e in events if e.cat is not None)
        float_ts = float_ts or any(type(e.ts) is float for e in events[:1000])
        batch = _events_to_batch(path, events, start)
        if batch.num_rows:
            batches.append(batch)
        del events
    del raw_events, data
    table = pa.Table.from_batches(batches) if batches else _empty_events()
    if table.num_rows == 0:
        raise TraceFormatError(
            f"{path}: no complete (ph=X) events; is this a torch.profiler trace with activities recorded?"
        )
    return _parsed_rank(path, header, table, categories, float_ts, source_bytes)


def _split_document(path: Path, data: bytes) -> tuple[dict[str, Any], list[msgspec.Raw]]:
    """Top-level metadata (small values decoded) and the events as undecoded slices."""
    start = data[:64].lstrip()[:1]
    try:
        if start == b"[":  # 2021 traces: the document is the event array itself
            return {}, _raw_list.decode(data)
        if start != b"{":
            raise TraceFormatError(f"{path}: not JSON (starts with {data[:16]!r}); expected a Kineto trace")
        top = _raw_object.decode(data)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: invalid JSON ({exc}); the file is truncated or corrupt") from exc
    if "traceEvents" not in top:
        keys = ", ".join(sorted(top)[:5]) or "none"
        raise TraceFormatError(f"{path}: JSON but not a Kineto trace (no traceEvents array; top-level keys: {keys})")
    try:
        raw_events = _raw_list.decode(top.pop("traceEvents"))
    except msgspec.ValidationError as exc:
        raise TraceFormatError(f"{path}: traceEvents is not an array ({exc})") from exc
    header: dict[str, Any] = {}
    for key, raw in top.items():
        try:
            if key == "distributedInfo":
                header[key] = msgspec.json.decode(raw, type=_DistributedInfo)
            elif key == "deviceProperties":
                header[key] = msgspec.json.decode(raw, type=list[_DeviceProperties])
            elif len(raw) <= 256:  # small metadata only: host names, versions, base time
                value = _any.decode(raw)
                if isinstance(value, (str, int, float, bool)):
                    header[key] = value
        except msgspec.ValidationError as exc:
            raise TraceFormatError(f"{path}: malformed {key} ({exc})") from exc
    return header, raw_events


def _decode_batch(path: Path, chunk: list[msgspec.Raw], offset: int) -> list[_Event]:
    try:
        return _event_batch.decode(b"[" + b",".join(chunk) + b"]")
    except msgspec.ValidationError as exc:
        # msgspec says e.g. "Expected `int`, got `str` - at `$[12].args.correlation`"; make the
        # index absolute and name the file.
        message = str(exc)
        where = message.rsplit(" - at `", 1)
        if len(where) == 2:
            location = where[1].rstrip("`")
            match = _INDEX_IN_PATH.match(location)
            if match:
                index = offset + int(match.group(1))
                key = location[match.end() :].lstrip(".") or "(event)"
                raise TraceFormatError(f"{path}: event {index}, key {key}: {where[0]}") from exc
        raise TraceFormatError(f"{path}: {message}") from exc
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: invalid JSON in events ({exc})") from exc


def _int_or_none(value: int | float | str | None) -> int | None:
    """An integer written as int, integral float or decimal string; anything else is None.

    2021 traces write thread ids as strings of digits (GPU rows as "stream 7"), ROCm traces write
    some byte counts as strings."""
    if type(value) is int or value is None:
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _ints(values: Sequence[Any], type_: pa.DataType = _INT64) -> pa.Array:
    """Integer column; the common all-int case converts in C, mixed columns are coerced per value."""
    try:
        inferred = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        inferred = None
    if inferred is not None and (pa.types.is_integer(inferred.type) or pa.types.is_null(inferred.type)):
        return inferred.cast(type_)
    return pa.array([_int_or_none(v) for v in values], type_)


def _ns(values: Sequence[int | float | None]) -> pa.Array:
    """µs (int or float) -> int64 ns, rounded to the nearest ns; None stays null.

    Float µs carry ns as three decimals; ``ts × 1000`` in one multiplication can land half a ns
    off for epoch-sized values, so the integer and fractional parts are scaled separately.
    """
    us = pa.array(values)
    if pa.types.is_integer(us.type) or pa.types.is_null(us.type):
        return pc.multiply(us.cast(pa.int64()), 1000)
    floats = us.to_numpy(zero_copy_only=False)  # nulls become NaN
    whole = np.floor(floats)
    with np.errstate(invalid="ignore"):
        ns = whole.astype(np.int64) * 1000 + np.rint((floats - whole) * 1000.0).astype(np.int64)
    return pa.array(ns, pa.int64(), mask=np.isnan(floats) if us.null_count else None)


def _json_text(raws: Sequence[msgspec.Raw]) -> pa.Array:
    """Raw JSON values -> dictionary-encoded compact JSON text (null when absent or JSON null).

    Only the distinct values are re-encoded, so ``[8, 512]`` and ``[8,512]`` from different
    writers become the same string at the cost of one decode per distinct value.
    """
    encoded = pa.array([bytes(r) or None for r in raws], pa.binary()).dictionary_encode()
    canonical = [msgspec.json.encode(_any.decode(v)).decode() for v in encoded.dictionary.to_pylist()]
    text = pa.array([None if c == "null" else c for c in canonical], pa.string())
    return pa.DictionaryArray.from_arrays(encoded.indices, text)


def _strings(values: Sequence[str | None]) -> pa.Array:
    return pa.array(values, pa.string()).dictionary_encode()


_ARG_FIELDS = _Args.__struct_fields__
_EVENT_FIELDS = _Event.__struct_fields__


def _columns_of(structs: list[Any], fields: tuple[str, ...]) -> dict[str, tuple[Any, ...]]:
    """Struct list -> one tuple per field (a C-level transpose instead of a loop per column)."""
    if not structs:
        return {f: () for f in fields}
    return dict(zip(fields, zip(*map(msgspec.structs.astuple, structs), strict=True), strict=True))


def _events_to_batch(path: Path, events: list[_Event], offset: int) -> pa.RecordBatch:
    """Complete events of one decoded batch -> a record batch with ``EVENTS`` columns."""
    positions = [i for i, e in enumerate(events) if e.ph == "X"]
    xs = [events[i] for i in positions]
    n = len(xs)
    ev = _columns_of(xs, _EVENT_FIELDS)
    for key in ("ts", "name"):
        if None in ev[key]:
            index = offset + positions[ev[key].index(None)]
            raise TraceFormatError(f"{path}: event {index} (ph X) has no {key!r}; the trace is damaged, re-export it")
    arg = _columns_of([a if a is not None else _NO_ARGS for a in ev["args"]], _ARG_FIELDS)
    category = _strings(ev["cat"])
    kinds = [KIND_BY_CATEGORY.get(c, "other") for c in category.dictionary.to_pylist()]
    kind = pa.DictionaryArray.from_arrays(category.indices, pa.array(kinds, pa.string()))
    is_gpu = pc.is_in(category.indices, pa.array([i for i, k in enumerate(kinds) if k in GPU_KINDS], pa.int32()))
    pid = _ints(ev["pid"])
    tid = _ints(ev["tid"])
    device = pc.if_else(is_gpu, pc.coalesce(_ints(arg["device"]), pid), None)
    stream = pc.if_else(is_gpu, pc.coalesce(_ints(arg["stream"]), tid), None)
    dims = [d if len(d) else d21 for d, d21 in zip(arg["input_dims"], arg["input_dims_2021"], strict=True)]
    columns: dict[str, pa.Array] = {
        "run_id": pa.nulls(n, pa.string()),
        "rank": pa.nulls(n, pa.int32()),
        "event_id": pa.array(np.asarray(positions, dtype=np.int64) + offset, pa.int64()),
        "kind": kind,
        "category": category,
        "name": _strings(ev["name"]),
        "ts_ns": _ns(ev["ts"]),
        "dur_ns": _ns(ev["dur"]),
        "pid": pid,
        "tid": tid,
        "device": pc.cast(device, pa.int32()),
        "stream": pc.cast(stream, pa.int32()),
        "correlation": _ints(arg["correlation"]),
        "external_id": pc.coalesce(_ints(arg["external_id"]), _ints(arg["external_id_2021"])),
        "sequence_number": _ints(arg["sequence_number"]),
        "fwd_thread_id": _ints(arg["fwd_thread_id"]),
        "input_dims": _json_text(dims),
        "input_types": _json_text(arg["input_types"]),
        "concrete_inputs": _json_text(arg["concrete_inputs"]),
        "bytes": _ints(arg["bytes"]),
        "grid": _json_text(arg["grid"]),
        "block": _json_text(arg["block"]),
        "coll_name": _strings(arg["coll_name"]),
        "in_msg_nelems": _ints(arg["in_msg_nelems"]),
        "out_msg_nelems": _ints(arg["out_msg_nelems"]),
        "group_size": _ints(arg["group_size"], pa.int32()),
        "coll_dtype": _strings(arg["dtype"]),
        "pg_name": _strings([v if v is None or type(v) is str else str(v) for v in arg["pg_name"]]),
        "pg_desc": _strings(arg["pg_desc"]),
        "pg_ranks": _json_text(arg["pg_ranks"]),
        "in_split_size": _json_text(arg["in_split_size"]),
        "out_split_size": _json_text(arg["out_split_size"]),
        "global_rank_start": _ints(arg["global_rank_start"], pa.int32()),
        "global_rank_stride": _ints(arg["global_rank_stride"], pa.int32()),
        "coll_seq": pc.coalesce(_ints(arg["seq"]), _ints(arg["comms_id"])),
        "src_rank": _ints(arg["src_rank"], pa.int32()),
        "dst_rank": _ints(arg["dst_rank"], pa.int32()),
    }
    return pa.RecordBatch.from_arrays([columns[f.name] for f in _EVENTS_SCHEMA], schema=_batch_schema(columns))


def _batch_schema(columns: dict[str, pa.Array]) -> pa.Schema:
    """``EVENTS`` field order with each column's actual type (strings may be dictionary-encoded)."""
    return pa.schema([pa.field(f.name, columns[f.name].type) for f in _EVENTS_SCHEMA])


def _empty_events() -> pa.Table:
    return _EVENTS_SCHEMA.empty_table()


def _parsed_rank(
    path: Path,
    header: dict[str, Any],
    table: pa.Table,
    categories: Counter[str],
    float_ts: bool,
    source_bytes: int,
) -> ParsedRank:
    dist: _DistributedInfo | None = header.pop("distributedInfo", None)
    devices: list[_DeviceProperties] = header.pop("deviceProperties", None) or []
    if categories.keys() & _ERA_2021:
        era = "2021"
    elif float_ts or categories.keys() & _ERA_2024_FLOWS or "baseTimeNanoseconds" in header:
        era = "2024"
    else:
        era = "2022"
    if dist is not None and dist.nccl_version:
        header["nccl_version"] = dist.nccl_version
    return ParsedRank(
        rank=dist.rank if dist is not None else None,
        rank_source="distributedInfo" if dist is not None and dist.rank is not None else "",
        events=table,
        file=path,
        file_bytes=path.stat().st_size,
        format="kineto",
        world_size=dist.world_size if dist is not None else None,
        backend=dist.backend if dist is not None else None,
        host=header.get("host_name") if isinstance(header.get("host_name"), str) else None,
        pid=_main_pid(table),
        device_name=_device_name(table, devices),
        schema_era=era,
        process_groups=list(dist.pg_config or []) if dist is not None else [],
        metadata=header,
        source_bytes=source_bytes,
    )


def _main_pid(table: pa.Table) -> int | None:
    """The process that ran most CPU operators (the training process)."""
    cpu = table.filter(pc.equal(pc.cast(table["kind"], pa.string()), "cpu_op"))["pid"]
    counts = pc.value_counts(cpu.drop_null())
    if len(counts) == 0:
        return None
    best = max(counts.to_pylist(), key=lambda c: c["counts"])
    return int(best["values"])


def _device_name(table: pa.Table, devices: list[_DeviceProperties]) -> str | None:
    """Name of the GPU the rank's kernels ran on (deviceProperties lists every visible GPU)."""
    if not devices:
        return None
    used = pc.unique(table["device"].drop_null()).to_pylist()
    for d in devices:
        if d.id in used and d.name:
            return d.name
    return devices[0].name if len(devices) == 1 else None

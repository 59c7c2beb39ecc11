"""Typed Kineto events: msgspec Structs for the keys tracecal keeps, and Struct lists -> Arrow batches.

The decoder skips every key not declared here, so a python_function event with ten args costs no
more than one without. Columns are read from the Structs in C (``attrgetter`` over a ``map``, one
field at a time), over only the events that carry the fields: most events have no collective args, and many
(python_function, flows) have none of the args tracecal stores.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Sequence
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracecal.errors import TraceFormatError
from tracecal.schema import EVENTS, arrow_schema

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

_Int = int | float | str | None
"""Integer args as written: some profilers write them as strings (ROCm ``"bytes": "128"``); they are
coerced after decoding, and values that are not integers become NULL."""

_NO_RAW = msgspec.Raw()


def _key(name: str, default: Any = None) -> Any:
    return msgspec.field(default=default, name=name)


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys tracecal keeps. ``gc=False``: Structs never form cycles, and untracked
    objects keep the garbage collector from walking millions of them during a parse."""

    # Linking and shapes: present on most CPU operators, runtime calls and GPU activities.
    external_id: _Int = _key("External id")
    external_id_2021: _Int = _key("external id")
    correlation: _Int = None
    device: _Int = None
    stream: _Int = None
    bytes: _Int = None
    sequence_number: _Int = _key("Sequence number")
    fwd_thread_id: _Int = _key("Fwd thread id")
    input_dims: msgspec.Raw = _key("Input Dims", _NO_RAW)
    input_dims_2021: msgspec.Raw = _key("Input dims", _NO_RAW)
    input_types: msgspec.Raw = _key("Input type", _NO_RAW)
    concrete_inputs: msgspec.Raw = _key("Concrete Inputs", _NO_RAW)
    grid: msgspec.Raw = _NO_RAW
    block: msgspec.Raw = _NO_RAW
    # Collectives: record_param_comms and (2024+) NCCL kernels only.
    coll_name: str | None = _key("Collective name")
    in_msg_nelems: _Int = _key("In msg nelems")
    out_msg_nelems: _Int = _key("Out msg nelems")
    group_size: _Int = _key("Group size")
    dtype: str | None = None
    pg_name: str | int | None = _key("Process Group Name")
    pg_desc: str | None = _key("Process Group Description")
    pg_ranks: msgspec.Raw = _key("Process Group Ranks", _NO_RAW)
    in_split_size: msgspec.Raw = _key("In split size", _NO_RAW)
    out_split_size: msgspec.Raw = _key("Out split size", _NO_RAW)
    global_rank_start: _Int = _key("Global rank start")
    global_rank_stride: _Int = _key("Global rank stride")
    seq: _Int = _key("Seq")
    comms_id: _Int = _key("Comms Id")
    src_rank: _Int = _key("Src Rank")
    dst_rank: _Int = _key("Dst Rank")


class Event(msgspec.Struct, gc=False):
    """One trace event; ``ph`` is the only key the Chrome trace format requires of every event."""

    ph: str
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: Args | None = None


_NO_ARGS = Args()
_CORE_FIELDS = Args.__struct_fields__[: Args.__struct_fields__.index("coll_name")]
_COMM_FIELDS = Args.__struct_fields__[len(_CORE_FIELDS) :]
_EVENT_FIELDS = ("cat", "name", "pid", "tid", "ts", "dur", "args")
_EVENTS_SCHEMA = arrow_schema(EVENTS)
_INT64 = pa.int64()
_INDEX_IN_PATH = re.compile(r"^\$\[(\d+)\]")
_events_decoder = msgspec.json.Decoder(list[Event])
_any = msgspec.json.Decoder()


def decode_events(path: Path, array: bytes | memoryview, offset: int) -> list[Event]:
    """Decode a JSON array of events; ``offset`` is the index of its first event in the file.

    Raises:
        TraceFormatError: naming the file, the event's index in the file and the key.
    """
    try:
        return _events_decoder.decode(array)
    except msgspec.ValidationError as exc:
        # msgspec says e.g. "Expected `int`, got `str` - at `$[12].args.correlation`".
        message, _, location = str(exc).rpartition(" - at `")
        match = _INDEX_IN_PATH.match(location)
        if match:
            key = location.rstrip("`")[match.end() :].lstrip(".") or "(the event itself)"
            index = offset + int(match.group(1))
            raise TraceFormatError(f"{path}: event {index}, key {key}: {message}; the trace is damaged") from exc
        raise TraceFormatError(f"{path}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise TraceFormatError(
            f"{path}: invalid JSON in traceEvents ({exc}); the file is truncated or corrupt"
        ) from exc


def events_to_batch(path: Path, events: list[Event], offset: int) -> pa.RecordBatch:
    """Complete (``ph`` X) events of one decoded list -> a record batch with the ``EVENTS`` columns.

    String columns are dictionary-encoded; ``run_id`` and ``rank`` are left null for the loader.

    Raises:
        TraceFormatError: a complete event without ``ts`` or ``name`` (file, event index and key).
    """
    phases = pa.array(list(map(attrgetter("ph"), events)), pa.string())
    positions = pc.indices_nonzero(pc.equal(phases, "X")).to_numpy().astype(np.int64)
    xs = _pick(events, positions.tolist())
    n = len(xs)
    ev = _transpose(xs, _EVENT_FIELDS)
    for key in ("ts", "name"):
        if None in ev[key]:
            index = offset + int(positions[ev[key].index(None)])
            raise TraceFormatError(f"{path}: event {index} (ph X) has no {key!r}; the trace is damaged, re-export it")
    args = ev["args"]
    with_args = [i for i, a in enumerate(args) if a is not None and a != _NO_ARGS]
    core_args = args if len(with_args) == n else _pick(args, with_args)
    core = _Sparse(_transpose(core_args, _CORE_FIELDS), with_args, n)
    # Collective args come as a set (record_param_comms, NCCL kernels): any of these keys marks one.
    with_comm = [
        j
        for j, a in enumerate(core_args)
        if a.coll_name is not None or a.pg_name is not None or a.src_rank is not None or a.dst_rank is not None
    ]
    comm = _Sparse(_transpose(_pick(core_args, with_comm), _COMM_FIELDS), _pick(with_args, with_comm), n)

    category = _strings(ev["cat"])
    kinds = [KIND_BY_CATEGORY.get(c, "other") for c in category.dictionary.to_pylist()]
    kind = pa.DictionaryArray.from_arrays(category.indices, pa.array(kinds, pa.string()))
    gpu_codes = pa.array([i for i, k in enumerate(kinds) if k in GPU_KINDS], pa.int32())
    is_gpu = pc.fill_null(pc.is_in(category.indices, gpu_codes), False)
    pid = _ints(ev["pid"])
    tid = _ints(ev["tid"])
    dims = core.raw("input_dims")
    if dims.null_count == n:  # 2021 traces say "Input dims"
        dims = core.raw("input_dims_2021")
    columns: dict[str, pa.Array] = {
        "run_id": pa.nulls(n, pa.string()),
        "rank": pa.nulls(n, pa.int32()),
        "event_id": pa.array(positions + offset, pa.int64()),
        "kind": kind,
        "category": category,
        "name": _strings(ev["name"]),
        "ts_ns": _ns(ev["ts"]),
        "dur_ns": _ns(ev["dur"]),
        "pid": pid,
        "tid": tid,
        "device": _narrow(pc.if_else(is_gpu, pc.coalesce(core.ints("device"), pid), None), pa.int32()),
        "stream": _narrow(pc.if_else(is_gpu, pc.coalesce(core.ints("stream"), tid), None), pa.int32()),
        "correlation": core.ints("correlation"),
        "external_id": pc.coalesce(core.ints("external_id"), core.ints("external_id_2021")),
        "sequence_number": core.ints("sequence_number"),
        "fwd_thread_id": core.ints("fwd_thread_id"),
        "input_dims": dims,
        "input_types": core.raw("input_types"),
        "concrete_inputs": core.raw("concrete_inputs"),
        "bytes": core.ints("bytes"),
        "grid": core.raw("grid"),
        "block": core.raw("block"),
        "coll_name": comm.strings("coll_name"),
        "in_msg_nelems": comm.ints("in_msg_nelems"),
        "out_msg_nelems": comm.ints("out_msg_nelems"),
        "group_size": comm.ints("group_size", pa.int32()),
        "coll_dtype": comm.strings("dtype"),
        "pg_name": comm.strings("pg_name"),
        "pg_desc": comm.strings("pg_desc"),
        "pg_ranks": comm.raw("pg_ranks"),
        "in_split_size": comm.raw("in_split_size"),
        "out_split_size": comm.raw("out_split_size"),
        "global_rank_start": comm.ints("global_rank_start", pa.int32()),
        "global_rank_stride": comm.ints("global_rank_stride", pa.int32()),
        "coll_seq": pc.coalesce(comm.ints("seq"), comm.ints("comms_id")),
        "src_rank": comm.ints("src_rank", pa.int32()),
        "dst_rank": comm.ints("dst_rank", pa.int32()),
    }
    schema = pa.schema([pa.field(f.name, columns[f.name].type) for f in _EVENTS_SCHEMA])
    return pa.RecordBatch.from_arrays([columns[f.name] for f in _EVENTS_SCHEMA], schema=schema)


def _pick(items: Sequence[Any], indices: Sequence[int]) -> list[Any]:
    """``[items[i] for i in indices]``, done by ``itemgetter`` in C."""
    if len(indices) < 2:
        return [items[i] for i in indices]
    return list(itemgetter(*indices)(items))


def _transpose(structs: Sequence[Any], fields: tuple[str, ...]) -> dict[str, Sequence[Any]]:
    """Struct list -> one list per field, each built in C by ``map(attrgetter(field), ...)`` (about 3x
    faster than transposing per-struct tuples with ``zip(*...)``)."""
    return {f: list(map(attrgetter(f), structs)) for f in fields}


class _Sparse:
    """Columns known only at some rows (``positions``) of an ``n``-row batch; the rest are null."""

    def __init__(self, columns: dict[str, Sequence[Any]], positions: list[int], n: int) -> None:
        self.columns = columns
        self.n = n
        self.take: pa.Array | None = None
        if len(positions) != n:
            index = np.zeros(n, dtype=np.int64)
            index[positions] = np.arange(len(positions))
            missing = np.ones(n, dtype=bool)
            missing[positions] = False
            self.take = pa.array(index, mask=missing)

    def _spread(self, values: pa.Array) -> pa.Array:
        if self.take is None:
            return values
        if len(values) == 0:
            return pa.nulls(self.n, values.type)
        return values.take(self.take)

    def ints(self, name: str, type_: pa.DataType = _INT64) -> pa.Array:
        return self._spread(_ints(self.columns[name], type_))

    def strings(self, name: str) -> pa.Array:
        values = [v if v is None or type(v) is str else str(v) for v in self.columns[name]]
        return self._spread(_strings(values))

    def raw(self, name: str) -> pa.Array:
        return self._spread(_json_text(self.columns[name]))


_INT64_RANGE = (-(2**63), 2**63 - 1)


@functools.lru_cache(maxsize=65536)
def _int_or_none(value: int | float | str | None) -> int | None:
    """An int64 written as int, integral float or decimal string; anything else is None.

    2021 traces write thread ids as strings of digits (GPU rows as "stream 7"), ROCm traces write
    some byte counts as strings."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return None
    elif isinstance(value, float):
        value = int(value) if value.is_integer() else None
    if type(value) is not int or not _INT64_RANGE[0] <= value <= _INT64_RANGE[1]:
        return None
    return value


def _ints(values: Sequence[Any], type_: pa.DataType = _INT64) -> pa.Array:
    """Integer column of ``type_``: the all-int case converts in C, all-string columns (2021 tids such as
    "4093687616" and "stream 7") parse in Arrow, mixed columns go value by value; what is not an integer
    of the type becomes NULL."""
    try:
        inferred: pa.Array | None = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        inferred = None
    column: pa.Array | None = None
    if inferred is not None and (pa.types.is_integer(inferred.type) or pa.types.is_null(inferred.type)):
        column = inferred.cast(_INT64)
    elif inferred is not None and pa.types.is_string(inferred.type):
        digits = pc.fill_null(pc.utf8_is_digit(inferred), False)
        with contextlib.suppress(pa.ArrowInvalid):  # beyond int64: the per-value path below
            column = pc.if_else(digits, pc.if_else(digits, inferred, "0").cast(_INT64), None)
    if column is None:
        column = pa.array([None if v is None else _int_or_none(v) for v in values], _INT64)
    return _narrow(column, type_)


def _narrow(column: pa.Array, type_: pa.DataType) -> pa.Array:
    """An int64 column as ``type_``, values the type cannot hold becoming NULL (never wrapped)."""
    if type_ == _INT64:
        return column
    info = np.iinfo(type_.to_pandas_dtype())
    outside = pc.or_(pc.less(column, int(info.min)), pc.greater(column, int(info.max)))
    return pc.if_else(pc.fill_null(outside, False), None, column).cast(type_)


def _ns(values: Sequence[int | float | None]) -> pa.Array:
    """µs (int or float) -> int64 ns, rounded to the nearest ns; None stays null.

    Float µs carry ns as three decimals; ``ts × 1000`` in one multiplication can land half a ns
    off, so the integer and fractional parts are scaled separately. That is exact while the float
    can hold ns, i.e. for ts < 2^43 µs (101 days of a monotonic clock — every 2024+ trace seen);
    beyond, the file itself has lost the ns digits and the nearest ns to its float is stored.
    """
    us = pa.array(values)
    if pa.types.is_integer(us.type) or pa.types.is_null(us.type):
        return pc.multiply(us.cast(pa.int64()), 1000)
    floats = us.cast(pa.float64()).fill_null(0.0).to_numpy()
    missing = us.is_null().to_numpy(zero_copy_only=False)
    whole = np.floor(floats)
    ns = whole.astype(np.int64) * 1000 + np.rint((floats - whole) * 1000.0).astype(np.int64)
    return pa.array(ns, pa.int64(), mask=missing if missing.any() else None)


def _json_text(raws: Sequence[msgspec.Raw]) -> pa.Array:
    """Raw JSON values -> dictionary-encoded compact JSON text (null when absent or JSON null).

    The raw slices are concatenated into one Arrow binary array without a Python object per value;
    only the distinct values are re-encoded, so ``[8, 512]`` and ``[8,512]`` from different writers
    become the same string.
    """
    n = len(raws)
    if n == 0:
        return pa.array([], pa.dictionary(pa.int32(), pa.string()))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, raws), dtype=np.int64, count=n), out=offsets[1:])
    binary = pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(raws))])
    encoded = binary.dictionary_encode()
    text = [_canonical_json(v) for v in encoded.dictionary.to_pylist()]
    indices = encoded.indices
    absent = [i for i, t in enumerate(text) if t is None]
    if absent:
        indices = pc.if_else(pc.is_in(indices, pa.array(absent, indices.type)), None, indices)
    dictionary = pa.array([t or "" for t in text], pa.string())
    return pa.DictionaryArray.from_arrays(indices, dictionary)


def _canonical_json(raw: bytes) -> str | None:
    """Compact JSON text of one value (None for an absent or null value); a string holding a JSON
    list (PyTorch writes ``"Process Group Ranks": "[0, 1]"``) is unwrapped to the list itself."""
    if not raw:
        return None
    value = _any.decode(raw)
    if isinstance(value, str) and value[:1] in ("[", "{"):
        with contextlib.suppress(msgspec.DecodeError):
            value = _any.decode(value)
    return None if value is None else msgspec.json.encode(value).decode()


def _strings(values: Sequence[str | None]) -> pa.Array:
    return pa.array(values, pa.string()).dictionary_encode()

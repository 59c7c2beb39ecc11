"""Typed Kineto events: msgspec Structs for the keys tracecal keeps, and Struct lists -> Arrow batches.

The decoder skips every key not declared here, so a python_function event with ten args costs no
more than one without. Columns are read from the Structs in C (``attrgetter`` over a ``map``, one
field at a time); the collective keys only from the events that carry a collective marker.

Cost is per event and field, so the per-column work avoids Python-level loops: integer args are
first decoded strictly (JSON integers only, as nearly every trace writes them), which lets a column
convert in one C call; a trace with integers written as strings or floats is decoded again
leniently and coerced value by value. A key that no event carries costs one pass over its values
and becomes a typed all-null column.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter, is_, is_not, itemgetter, ne
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from msgspec.structs import astuple

from tracecal.errors import TraceFormatError
from tracecal.schema import EVENTS, arrow_schema
from tracecal.vocabulary import DEVICE_TRACK_KINDS

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


_Int = int | float | str | None
"""Integer args as written: some profilers write them as strings (ROCm ``"bytes": "128"``); they are
coerced after decoding, and values that are not integers become NULL."""

_NO_RAW = msgspec.Raw()

TRANSPOSE_ROWS = 4_096
"""Structs transposed at a time (``_Fields``): a block small enough to stay in the CPU cache."""

_ARG_FIELDS: list[tuple[str, str | None, str]] = [
    # (attribute, JSON key when it differs, kind): kind "int" (an integer), "text_int" (an integer
    # that profilers also write as text), "raw" (any JSON value, kept as text), "str" (a string),
    # "name" (a string or an integer).
    # Linking and shapes: present on most CPU operators, runtime calls and GPU activities.
    ("external_id", "External id", "int"),
    ("external_id_2021", "external id", "int"),
    ("correlation", None, "int"),
    ("device", None, "int"),
    ("stream", None, "int"),
    ("bytes", None, "text_int"),  # ROCm writes "bytes": "128": as written in both decoders
    ("sequence_number", "Sequence number", "int"),
    ("fwd_thread_id", "Fwd thread id", "int"),
    ("input_dims", "Input Dims", "raw"),
    ("input_dims_2021", "Input dims", "raw"),
    ("input_types", "Input type", "raw"),
    ("concrete_inputs", "Concrete Inputs", "raw"),
    ("grid", None, "raw"),
    ("block", None, "raw"),
    # Collectives: record_param_comms and (2024+) NCCL kernels only. Any of the first four marks a
    # collective's args (``_COMM_MARKERS``); the rest are read from marked events only.
    ("coll_name", "Collective name", "str"),
    ("pg_name", "Process Group Name", "name"),
    ("src_rank", "Src Rank", "int"),
    ("dst_rank", "Dst Rank", "int"),
    ("in_msg_nelems", "In msg nelems", "int"),
    ("out_msg_nelems", "Out msg nelems", "int"),
    ("group_size", "Group size", "int"),
    ("dtype", None, "str"),
    ("pg_desc", "Process Group Description", "str"),
    ("pg_ranks", "Process Group Ranks", "raw"),
    ("in_split_size", "In split size", "raw"),
    ("out_split_size", "Out split size", "raw"),
    ("global_rank_start", "Global rank start", "int"),
    ("global_rank_stride", "Global rank stride", "int"),
    ("seq", "Seq", "int"),
    ("comms_id", "Comms Id", "int"),
]
"""The ``args`` keys tracecal keeps, declared once for both decoders below."""

_ARG_TYPES: dict[str, dict[str, Any]] = {
    "strict": {"int": int | None, "text_int": _Int, "raw": msgspec.Raw, "str": str | None, "name": str | int | None},
    "lenient": {"int": _Int, "text_int": _Int, "raw": msgspec.Raw, "str": str | None, "name": str | int | None},
}


_PROCESS_ARG_FIELDS: list[tuple[str, str | None, str]] = [("process_label", "name", "raw"), ("labels", None, "raw")]
"""The args of a process metadata event (``process_name``: ``name``; ``process_labels``: ``labels``)."""


def _args_struct(name: str, types: dict[str, Any], fields_: list[tuple[str, str | None, str]] = _ARG_FIELDS) -> Any:
    """An ``args`` Struct. ``gc=False``: Structs never form cycles, and untracked objects keep the
    garbage collector from walking millions of them during a parse. ``frozen``: the empty instance
    is every event's default (no None to test for)."""
    fields: list[Any] = [
        (attr, types[kind], msgspec.field(default=_NO_RAW if kind == "raw" else None, name=key or attr))
        for attr, key, kind in fields_
    ]
    return msgspec.defstruct(name, fields, gc=False, frozen=True, module=__name__)


Args = _args_struct("Args", _ARG_TYPES["lenient"], [*_ARG_FIELDS, *_PROCESS_ARG_FIELDS])
"""Every kept arg, integers as written: some profilers write them as strings (ROCm ``"bytes": "128"``)
or floats; they are coerced after decoding, and values that are not integers become NULL."""

StrictArgs = _args_struct("StrictArgs", _ARG_TYPES["strict"])
"""Every kept arg, integer args as JSON integers only: what nearly every trace writes, and what lets
their columns convert in C without a per-value check. A trace this rejects is decoded with ``Args``."""


_EVENT_FIELDS: list[Any] = [
    ("cat", str | None, None),
    ("name", str | None, None),
    ("pid", int | str | None, None),
    ("tid", int | str | None, None),
    ("ts", int | float | None, None),
    ("dur", int | float | None, None),
]
"""The keys kept of an event besides ``ph`` and ``args``."""

Event = msgspec.defstruct(
    "Event", [("ph", str), *_EVENT_FIELDS, ("args", Args | None, Args())], gc=False, module=__name__
)
"""Any trace event, lenient: ``ph`` is the only key the Chrome trace format requires of every event."""

CompleteEvent = msgspec.defstruct(
    "CompleteEvent",
    [*_EVENT_FIELDS, ("args", StrictArgs | None, StrictArgs())],
    tag_field="ph",
    tag="X",
    gc=False,
    module=__name__,
)
"""A complete event (``"ph": "X"``), strict: what ``events_to_batch`` stores."""


class IncompleteEvent(msgspec.Struct, tag_field="ph", gc=False):
    """Any other event (flow, instant, metadata, counter...): only its category is read (the era)."""

    cat: str | None = None


ProcessArgs = _args_struct("ProcessArgs", _ARG_TYPES["strict"], _PROCESS_ARG_FIELDS)


class MetadataEvent(IncompleteEvent, tag="M", gc=False):
    """A metadata event (``"ph": "M"``), strict: a process's name and labels are read (which rank a
    process of a merged trace is: ``process_labels``); there are a few per process."""

    name: str | None = None
    pid: int | str | None = None
    args: ProcessArgs | None = None  # type: ignore[valid-type]


PROCESS_METADATA = ("process_name", "process_labels")
"""Metadata events whose text is collected per process (``events_to_batch``'s ``processes``)."""

_OTHER_PHASES = "BEIiCbneSTpFstfPNODVvRc()"
"""Every phase of the Chrome trace event format but ``X`` and ``M``. msgspec reads ``ph`` first (Kineto writes it
first) and decodes the event into ``CompleteEvent`` or into one ``IncompleteEvent`` per phase: a flow
event, a third of a GPU trace's events, makes one small Struct instead of an event with its name,
ids and timestamps, which makes decoding a GPU trace markedly cheaper. A phase not listed fails the
strict decoder, and the trace is read by the lenient one."""


def _strict_event_union() -> Any:
    """``CompleteEvent`` or one ``IncompleteEvent`` subclass per phase of ``_OTHER_PHASES``."""
    union: Any = CompleteEvent | MetadataEvent
    for phase in _OTHER_PHASES:
        name = f"IncompleteEvent{ord(phase)}"
        union = union | msgspec.defstruct(name, [], bases=(IncompleteEvent,), tag=phase, gc=False, module=__name__)
    return union


StrictEvent: Any = _strict_event_union()
"""One event, strict: ``CompleteEvent`` or an ``IncompleteEvent``, told apart by ``ph``."""

_ARG_NAMES = tuple(attr for attr, _, _ in _ARG_FIELDS)
_ARGLESS_CATEGORIES = frozenset({"python_function"})
"""Categories whose events carry none of the kept args in every trace seen (see ``_Rows``)."""
_COMM_MARKERS = ("coll_name", "pg_name", "src_rank", "dst_rank")
"""Collective args come as a set (record_param_comms, NCCL kernels): any of these keys marks one, and
the other collective keys are read from marked events only."""
_EVERY_EVENT_ARGS = max(map(_ARG_NAMES.index, _COMM_MARKERS)) + 1
"""The leading ``args`` fields read from every event: linking, shapes and the collective markers, which
``_ARG_FIELDS`` declares first. The other collective fields are transposed for the marked events only."""
_GET = {f: attrgetter(f) for f in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", *_ARG_NAMES)}
_EVENTS_SCHEMA = arrow_schema(EVENTS)
_INT64 = pa.int64()
_NULL_INT64 = pa.scalar(None, _INT64)
"""The NULL of ``pc.if_else`` on int64 columns: a bare None is a null-typed scalar that if_else must
first unify with the column's type, which makes every call slower."""
_DICT = pa.dictionary(pa.int32(), pa.string())
BATCH_SCHEMA = pa.schema(
    [pa.field(f.name, _DICT) if f.type == pa.string() and f.name != "run_id" else f for f in _EVENTS_SCHEMA]
)
"""What ``events_to_batch`` returns: ``EVENTS``, its text columns (but ``run_id``) dictionary-encoded."""
_COMM_COLUMNS = (
    "coll_name", "in_msg_nelems", "out_msg_nelems", "group_size", "coll_dtype", "pg_name", "pg_desc",
    "pg_ranks", "in_split_size", "out_split_size", "global_rank_start", "global_rank_stride",
    "coll_seq", "src_rank", "dst_rank",
)  # fmt: skip
"""The collective columns ``_comm_columns`` fills: all NULL (typed) when no event carries a collective arg."""
_COMM_TYPES = {name: BATCH_SCHEMA.field(name).type for name in _COMM_COLUMNS}
_INDEX_IN_PATH = re.compile(r"^\$\[(\d+)\]")
# Event types made by defstruct are variables to mypy, hence the ignores.
_strict_decoder = msgspec.json.Decoder(list[StrictEvent])
_events_decoder = msgspec.json.Decoder(list[Event])  # type: ignore[valid-type]
_any = msgspec.json.Decoder()


def decode_events(path: Path, array: bytes | memoryview, offset: int) -> tuple[list[Any], bool]:
    """Decode a JSON array of events; ``offset`` is the index of its first event in the file.

    Returns the events and whether they are ``StrictEvent`` (integer args are JSON integers or
    absent), else ``Event``.

    Raises:
        TraceFormatError: naming the file, the event's index in the file and the key.
    """
    try:
        return _strict_decoder.decode(array), True
    except msgspec.ValidationError:
        pass  # an integer arg written as a string or float (or a damaged event): the lenient decoder says
    except msgspec.DecodeError as exc:
        raise TraceFormatError(
            f"{path}: invalid JSON in traceEvents ({exc}); the file is truncated or corrupt"
        ) from exc
    try:
        return _events_decoder.decode(array), False
    except msgspec.ValidationError as exc:
        # msgspec says e.g. "Expected `int`, got `str` - at `$[12].args.correlation`".
        message, _, location = str(exc).rpartition(" - at `")
        match = _INDEX_IN_PATH.match(location)
        if match:
            key = location.rstrip("`")[match.end() :].lstrip(".") or "(the event itself)"
            index = offset + int(match.group(1))
            raise TraceFormatError(f"{path}: event {index}, key {key}: {message}; the trace is damaged") from exc
        raise TraceFormatError(f"{path}: {exc}") from exc


def events_to_batch(
    path: Path,
    events: list[Any],
    offset: int,
    strict: bool = False,
    seen: set[str | None] | None = None,
    processes: dict[int, list[str]] | None = None,
) -> pa.RecordBatch:
    """Complete (``ph`` X) events of one decoded list -> a record batch of ``BATCH_SCHEMA``.

    ``strict``: the events are ``StrictEvent`` (``decode_events`` says). Text columns are
    dictionary-encoded; ``run_id`` and ``rank`` are left null for the loader. ``seen``, when
    given, gains the category of every event of the list, complete or not (the complete events' from
    their dictionary-encoded column: no hashing of a string per event). ``processes``, when given,
    gains the text of every ``process_name`` / ``process_labels`` metadata event, per integer pid.

    Raises:
        TraceFormatError: a complete event without ``ts`` or ``name`` (file, event index and key).
    """
    positions = _complete_positions(events, strict)
    xs = events if len(positions) == len(events) else _pick(events, positions.tolist())
    n = len(xs)
    top = _Fields(xs)
    name = _strings(top["name"])
    ts = _ns(top["ts"])
    for key, column in (("ts", ts), ("name", name)):
        if column.null_count:
            index = offset + int(positions[pc.index(column.is_null(), True).as_py()])
            raise TraceFormatError(f"{path}: event {index} (ph X) has no {key!r}; the trace is damaged, re-export it")
    args = top["args"]
    if None in args:  # "args": null
        args = [_NO_ARGS[strict] if a is None else a for a in args]
    ints = _exact_ints if strict else _ints
    category = _strings(top["cat"])
    if seen is not None or processes is not None:
        others = _incomplete(events, positions)
        if seen is not None:
            _add_categories(seen, category, others)
        if processes is not None and others:
            _add_process_labels(processes, others, strict)
    categories = category.dictionary.to_pylist()
    kinds = [KIND_BY_CATEGORY.get(c, "other") for c in categories]
    kind = pa.DictionaryArray.from_arrays(category.indices, pa.array(kinds, pa.string()))
    if _ARGLESS_CATEGORIES.intersection(categories):
        # Many events carry none of the kept args (python_function: only Python ids): the arg
        # columns are read from the others. The test is exact, the category only says it pays.
        keep = np.fromiter(map(ne, args, repeat(_NO_ARGS[strict])), dtype=bool, count=n)
        core = _Rows.of(args, keep, ints, _EVERY_EVENT_ARGS)
    else:
        core = _Rows.of(args, None, ints, _EVERY_EVENT_ARGS)
    pid = _id_ints(top["pid"])
    tid = _id_ints(top["tid"])
    gpu_codes = [i for i, k in enumerate(kinds) if k in DEVICE_TRACK_KINDS]
    if gpu_codes:
        is_gpu = pc.fill_null(pc.is_in(category.indices, pa.array(gpu_codes, pa.int32())), False)
        device = _narrow(pc.if_else(is_gpu, pc.coalesce(core.ints("device"), pid), _NULL_INT64), pa.int32())
        stream = _narrow(pc.if_else(is_gpu, pc.coalesce(core.ints("stream"), tid), _NULL_INT64), pa.int32())
    else:  # a CPU-only trace: device and stream are for GPU activities only
        device = stream = pa.nulls(n, pa.int32())
    dims, dims_2021, input_types, concrete_inputs, grid, block = core.raw(
        "input_dims", "input_dims_2021", "input_types", "concrete_inputs", "grid", "block"
    )
    dims = _coalesce(dims, dims_2021)  # 2021 traces say "Input dims"; row by row, whatever a chunk holds
    columns: dict[str, pa.Array] = {
        "run_id": pa.nulls(n, pa.string()),
        "rank": pa.nulls(n, pa.int32()),
        "event_id": pa.array(positions + offset, pa.int64()),
        "kind": kind,
        "category": category,
        "name": name,
        "ts_ns": ts,
        "dur_ns": _ns(top["dur"]),
        "pid": pid,
        "tid": tid,
        "device": device,
        "stream": stream,
        "correlation": core.ints("correlation"),
        "external_id": _coalesce(core.ints("external_id"), core.ints("external_id_2021")),
        "sequence_number": core.ints("sequence_number"),
        "fwd_thread_id": core.ints("fwd_thread_id"),
        "input_dims": dims,
        "input_types": input_types,
        "concrete_inputs": concrete_inputs,
        "bytes": core.ints("bytes", lenient=True),
        "grid": grid,
        "block": block,
    }
    columns.update(_comm_columns(core))
    return pa.RecordBatch.from_arrays([columns[f.name] for f in BATCH_SCHEMA], schema=BATCH_SCHEMA)


def _complete_positions(events: list[Any], strict: bool) -> np.ndarray:
    """Positions (int64) of the complete events: by their type when ``strict``, else by ``ph``."""
    if strict:
        complete = map(is_, map(type, events), repeat(CompleteEvent))
        return np.flatnonzero(np.fromiter(complete, dtype=bool, count=len(events))).astype(np.int64)
    phases = pa.array(list(map(_GET["ph"], events)), pa.string())
    return pc.indices_nonzero(pc.equal(phases, "X")).to_numpy().astype(np.int64)


def _incomplete(events: list[Any], positions: np.ndarray) -> list[Any]:
    """The events of ``events`` that are not at ``positions`` (the complete ones)."""
    if len(positions) == len(events):
        return []
    others = np.ones(len(events), dtype=bool)
    others[positions] = False
    return _pick(events, np.flatnonzero(others).tolist())


def _add_categories(categories: set[str | None], category: pa.Array, others: list[Any]) -> None:
    """Add the categories of the complete events (from their column) and of the ``others``."""
    categories.update(category.dictionary.to_pylist())
    if category.null_count:
        categories.add(None)
    categories.update(map(_GET["cat"], others))


def _add_process_labels(processes: dict[int, list[str]], others: list[Any], strict: bool) -> None:
    """Add the text of the process metadata events among ``others`` to ``processes`` (per integer pid)."""
    if strict:
        metadata = list(compress(others, map(is_, map(type, others), repeat(MetadataEvent))))
    else:
        metadata = [e for e in others if e.ph == "M"]
    for event in metadata:
        if event.name not in PROCESS_METADATA or event.args is None or type(event.pid) is not int:
            continue
        raw = event.args.process_label if event.name == "process_name" else event.args.labels
        if raw is _NO_RAW or not len(raw):
            continue
        with contextlib.suppress(msgspec.DecodeError):
            text = _any.decode(raw)
            if isinstance(text, str):
                processes.setdefault(event.pid, []).append(text)


def _comm_columns(core: _Rows) -> dict[str, pa.Array]:
    """The collective columns, read from the events that carry a collective marker (null elsewhere)."""
    marked = np.zeros(len(core.args), dtype=bool)
    for field in _COMM_MARKERS:
        values = core.values(field)
        if not _all_none(values):
            marked |= np.fromiter(map(is_not, values, repeat(None)), dtype=bool, count=len(values))
    if not marked.any():
        return {name: pa.nulls(core.n, type_) for name, type_ in _COMM_TYPES.items()}
    picked = np.flatnonzero(marked)
    comm = _Rows(_pick(core.args, picked.tolist()), np.arange(len(picked)), len(picked), core.ints_of)
    pg_ranks, in_split_size, out_split_size = comm.raw("pg_ranks", "in_split_size", "out_split_size")
    columns = [
        comm.strings("coll_name"),
        comm.ints("in_msg_nelems"),
        comm.ints("out_msg_nelems"),
        comm.ints("group_size", pa.int32()),
        comm.strings("dtype"),
        comm.strings("pg_name"),
        comm.strings("pg_desc"),
        pg_ranks,
        in_split_size,
        out_split_size,
        comm.ints("global_rank_start", pa.int32()),
        comm.ints("global_rank_stride", pa.int32()),
        _coalesce(comm.ints("seq"), comm.ints("comms_id")),
        comm.ints("src_rank", pa.int32()),
        comm.ints("dst_rank", pa.int32()),
    ]
    # The few marked rows are converted on their own and spread to the batch's rows in one take.
    rows = core.rows[picked]
    if len(rows) != core.n:
        columns = pa.RecordBatch.from_arrays(columns, names=_COMM_COLUMNS).take(_spread_index(rows, core.n)).columns
    return dict(zip(_COMM_COLUMNS, columns, strict=True))


class _Fields:
    """One field of every Struct of a list at a time (``fields[name]``: a sequence, one value per Struct).

    The Structs are transposed at the first access, ``TRANSPOSE_ROWS`` at a time: one
    ``msgspec.structs.astuple`` per Struct and a ``zip`` give every field of a block at once while its
    Structs and their tuples stay in the CPU cache, and each block's values are copied into one list
    per field (a slice assignment in C). The lists then convert to Arrow in one call per column, however
    many Structs there are. With ``leading``, only the Structs' first ``leading`` fields are transposed
    (``zip`` builds a field's values when they are asked for, so the fields after them cost nothing).
    """

    def __init__(self, structs: Sequence[Any], leading: int | None = None) -> None:
        self.structs, self.leading = structs, leading
        self.columns: dict[str, Sequence[Any]] | None = None

    def __getitem__(self, field: str) -> Sequence[Any]:
        if self.columns is None:
            self.columns = _transposed(self.structs, self.leading)
        return self.columns[field]


def _transposed(structs: Sequence[Any], leading: int | None = None) -> dict[str, Sequence[Any]]:
    """The first ``leading`` fields (all when None) of ``structs`` (Structs of one type), each as a
    sequence of values, one per Struct."""
    n = len(structs)
    if not n:
        return dict.fromkeys(_GET, ())
    names = type(structs[0]).__struct_fields__[:leading]
    # zip(names, ...) stops at the last name without building the columns after it
    if n <= TRANSPOSE_ROWS:
        return dict(zip(names, zip(*map(astuple, structs))))  # noqa: B905
    columns: list[list[Any]] = [[None] * n for _ in names]
    for start in range(0, n, TRANSPOSE_ROWS):
        stop = min(start + TRANSPOSE_ROWS, n)
        for column, values in zip(columns, zip(*map(astuple, structs[start:stop]))):  # noqa: B905
            column[start:stop] = values
    return dict(zip(names, columns, strict=True))


class _Rows:
    """The ``args`` of the rows ``rows`` of an ``n``-row batch; columns read from them are spread back
    to ``n`` rows, null elsewhere. ``ints`` converts integer args (``_exact_ints`` or ``_ints``)."""

    def __init__(self, args: Sequence[Any], rows: np.ndarray, n: int, ints: Any, leading: int | None = None) -> None:
        self.args, self.rows, self.n, self.ints_of = args, rows, n, ints
        self.fields = _Fields(args, leading)
        self.take: pa.Array | None = None
        if len(rows) != n:
            self.take = _spread_index(rows, n)

    @classmethod
    def of(cls, args: Sequence[Any], keep: np.ndarray | None, ints: Any, leading: int | None = None) -> _Rows:
        """The rows of ``args`` where ``keep`` is set (all when None); ``leading``: as ``_Fields``."""
        if keep is None or keep.all():
            return cls(args, np.arange(len(args)), len(args), ints, leading)
        rows = np.flatnonzero(keep)
        return cls(_pick(args, rows.tolist()), rows, len(args), ints, leading)

    def values(self, field: str) -> Sequence[Any]:
        return self.fields[field]

    def _spread(self, values: pa.Array) -> pa.Array:
        if self.take is None:
            return values
        return values.take(self.take)

    def ints(self, field: str, type_: pa.DataType = _INT64, lenient: bool = False) -> pa.Array:
        return self._spread((_ints if lenient else self.ints_of)(self.values(field), type_))

    def strings(self, field: str) -> pa.Array:
        values = [v if v is None or type(v) is str else str(v) for v in self.values(field)]
        return self._spread(_strings(values))

    def raw(self, *fields: str) -> list[pa.Array]:
        """JSON-valued columns, converted together (``_json_texts``)."""
        return [self._spread(column) for column in _json_texts([self.values(field) for field in fields])]


_NO_ARGS = {True: StrictArgs(), False: Args()}


def _spread_index(rows: np.ndarray, n: int) -> pa.Array:
    """The ``take`` index that puts the values of ``rows`` (ascending) back at those rows of ``n``, null elsewhere."""
    index = np.zeros(n, dtype=np.int64)
    index[rows] = np.arange(len(rows))
    missing = np.ones(n, dtype=bool)
    missing[rows] = False
    return pa.array(index, mask=missing)


def _all_none(values: Sequence[Any]) -> bool:
    """Whether every value is None; stops at the first value when it is not (the usual answer)."""
    return not values or (values[0] is None and values.count(None) == len(values))


def _coalesce(first: pa.Array, second: pa.Array) -> pa.Array:
    if second.null_count == len(second):
        return first
    return pc.coalesce(first, second)


def _pick(items: Sequence[Any], indices: Sequence[int]) -> list[Any]:
    """``[items[i] for i in indices]``, done by ``itemgetter`` in C."""
    if len(indices) < 2:
        return [items[i] for i in indices]
    return list(itemgetter(*indices)(items))


_INT64_RANGE = (-(2**63), 2**63 - 1)

_DECIMAL = re.compile(r"^-?[0-9]+$")
"""An integer written as text: ASCII digits with an optional minus (not Python's ``int()``, which also
takes spaces, underscores and other scripts' digits); both ``_ints`` paths read text by it."""


def _int_or_none(value: int | float | str | None) -> int | None:
    """An int64 written as int, integral float or decimal string; anything else is None.

    2021 traces write thread ids as strings of digits (GPU rows as "stream 7"), ROCm traces write
    some byte counts as strings."""
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):  # as the all-string path in ``_ints`` reads them
            return None
        value = int(value)
    elif isinstance(value, float):
        value = int(value) if value.is_integer() else None
    if type(value) is not int or not _INT64_RANGE[0] <= value <= _INT64_RANGE[1]:
        return None
    return value


def _ints(values: Sequence[Any], type_: pa.DataType = _INT64) -> pa.Array:
    """Integer column of ``type_``: the all-int case converts in C, all-string columns (2021 tids such as
    "4093687616" and "stream 7") parse in Arrow, mixed columns go value by value; what is not an integer
    of the type becomes NULL."""
    if _all_none(values):
        return pa.nulls(len(values), type_)
    try:
        inferred: pa.Array | None = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        inferred = None
    column: pa.Array | None = None
    if inferred is not None and (pa.types.is_integer(inferred.type) or pa.types.is_null(inferred.type)):
        column = inferred.cast(_INT64)
    elif inferred is not None and pa.types.is_string(inferred.type):
        digits = pc.fill_null(pc.match_substring_regex(inferred, _DECIMAL.pattern), False)
        with contextlib.suppress(pa.ArrowInvalid):  # beyond int64: the per-value path below
            column = pc.if_else(digits, pc.if_else(digits, inferred, "0").cast(_INT64), _NULL_INT64)
    if column is None:  # mixed types (a 2024 trace's pid "Spans" among ints): few distinct values
        ints = {v: _int_or_none(v) for v in set(values)}
        column = pa.array(list(map(ints.__getitem__, values)), _INT64)
    return _narrow(column, type_)


def _id_ints(values: Sequence[Any]) -> pa.Array:
    """``_ints`` for pid/tid, decoded as int or str (never float, which a typed conversion would
    truncate): ints convert in one C call without ``_ints``' type-inference pass (a third of its
    cost); an int beyond int64 makes the conversion fail and takes ``_ints``' path.

    A few strings among ints (Kineto ends its complete events with the profiler's own span: pid
    ``"Spans"``, tid ``"PyTorch Profiler"``) are found by type, converted as ``_ints`` converts a
    column of ints and strings (value by value), and the ints still take one C call; a column of
    mostly strings (2021 traces) is ``_ints``' own case."""
    if _all_none(values):
        return pa.nulls(len(values), _INT64)
    try:
        return pa.array(values, _INT64)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    texts = np.flatnonzero(np.fromiter(map(is_, map(type, values), repeat(str)), dtype=bool, count=len(values)))
    if not 0 < len(texts) <= len(values) // 2:
        return _ints(values)
    ints = list(values)
    for i in texts.tolist():
        ints[i] = _int_or_none(ints[i])
    try:
        return pa.array(ints, _INT64)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return _ints(values)


def _exact_ints(values: Sequence[Any], type_: pa.DataType = _INT64) -> pa.Array:
    """``_ints`` for values known to be Python ints or None (a ``StrictArgs`` field): one conversion in
    C; ints beyond int64 (which the decoder accepts) take the checking path."""
    if _all_none(values):
        return pa.nulls(len(values), type_)
    try:
        column = pa.array(values, _INT64)
    except OverflowError:
        return _ints(values, type_)
    return _narrow(column, type_)


def _narrow(column: pa.Array, type_: pa.DataType) -> pa.Array:
    """An int64 column as ``type_``, values the type cannot hold becoming NULL (never wrapped)."""
    if type_ == _INT64:
        return column
    low, high = -(2 ** (type_.bit_width - 1)), 2 ** (type_.bit_width - 1) - 1  # signed types only
    bounds = pc.min_max(column).as_py()
    if bounds["min"] is None or (bounds["min"] >= low and bounds["max"] <= high):
        return column.cast(type_)
    outside = pc.or_(pc.less(column, low), pc.greater(column, high))
    return pc.if_else(pc.fill_null(outside, False), _NULL_INT64, column).cast(type_)


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


def _json_texts(columns: Sequence[Sequence[msgspec.Raw]]) -> list[pa.Array]:
    """Columns of raw JSON values -> dictionary-encoded compact JSON text (null when absent or JSON null).

    The columns are converted together (one join, one dictionary encoding: each step's fixed cost is paid
    once per batch, not per column) and come back as slices sharing one dictionary. The raw slices are
    concatenated into one Arrow binary array without a Python object per value: each is followed by a
    NUL byte, which JSON text cannot hold (msgspec rejects it, even inside strings), so the value
    boundaries are found by numpy instead of a ``len`` call per value. Only the distinct values are
    re-encoded (and remembered across batches: the ranks of a run share most shapes), so ``[8, 512]``
    and ``[8,512]`` from different writers become the same string.
    """
    results: list[pa.Array | None] = []
    present: list[Sequence[msgspec.Raw]] = []
    for raws in columns:
        n = len(raws)
        if not raws or (raws[0] is _NO_RAW and raws.count(_NO_RAW) == n):  # the key is in no event
            # An absent value is the default Raw itself, and list.count tests identity before equality:
            # a pass at a few ns per event instead of a call of len per event.
            results.append(pa.nulls(n, _DICT))
        else:
            results.append(None)
            present.append(raws)
    if not present:
        return cast("list[pa.Array]", results)
    values: list[msgspec.Raw | bytes] = []
    for raws in present:
        values += raws
    total = len(values)
    values.append(b"")  # the last value's terminator
    data = b"\0".join(values)
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0)
    if len(ends) != total:  # raw JSON values hold no NUL byte (msgspec rejects one): a decoder change
        raise TraceFormatError("a raw JSON argument value holds a NUL byte; please report this trace")
    offsets = np.empty(total + 1, dtype=np.int64)
    offsets[0] = 0
    np.add(ends, 1, out=offsets[1:])
    combined = _text_dictionary(data, offsets)
    start = 0
    for i, result in enumerate(results):
        if result is None:
            size = len(columns[i])
            results[i] = combined.slice(start, size)
            start += size
    return cast("list[pa.Array]", results)


def _text_dictionary(data: bytes, offsets: np.ndarray) -> pa.DictionaryArray:
    """The raw JSON values ``data[offsets[i]:offsets[i + 1]]``, each ending in a NUL byte that is not
    part of it, as dictionary-encoded compact JSON text, null for an empty value."""
    binary = pa.Array.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    encoded = binary.dictionary_encode()
    distinct = encoded.dictionary.to_pylist()
    text = list(map(_CANONICAL.get, distinct, repeat(_UNSEEN)))  # the cache's keys keep their terminator
    if _UNSEEN in text:
        if len(_CANONICAL) > _CANONICAL_LIMIT:
            _CANONICAL.clear()
        for i, value in enumerate(distinct):
            if text[i] is _UNSEEN:
                text[i] = _CANONICAL[value] = _canonical_json(value[:-1])
    codes = pa.array([None if t is None else i for i, t in enumerate(text)], pa.int32())
    return pa.DictionaryArray.from_arrays(codes.take(encoded.indices), pa.array([t or "" for t in text], pa.string()))


_UNSEEN = object()
_CANONICAL: dict[bytes, Any] = {}
"""Compact text (or None) of every distinct raw JSON value seen, keyed with its NUL terminator: the ranks
of a run share most shapes."""
_CANONICAL_LIMIT = 50_000
"""Values remembered at most (then all forgotten at once), per process: a value is one distinct JSON
arg text, tens of bytes for dims and types, up to a few KB for long Concrete Inputs."""


_INT_LIST_BYTES = b"0123456789[]," + b" \t\n\r\x0b\x0c"
_LONG_NUMBER = re.compile(rb"[0-9]{19}")
"""JSON text of nested lists of integers below 10^18 (which any decoder reads back exactly) has only
the bytes ``_INT_LIST_BYTES`` and no run of 19 digits: tested by ``bytes.translate`` deleting them
(C speed; a regex over pretty-printed lists cost 2-3x as much)."""


def _canonical_json(raw: bytes) -> str | None:
    """Compact JSON text of one value (None for an absent or null value); a string holding a JSON
    list (PyTorch writes ``"Process Group Ranks": "[0, 1]"``) is unwrapped to the list itself.

    Lists of small non-negative integers (Input Dims, grid, block: most distinct values) only lose
    their whitespace, exactly as a decode + encode would write them; the rest go through msgspec."""
    if not raw:
        return None
    if not raw.translate(None, _INT_LIST_BYTES) and (len(raw) < 19 or _LONG_NUMBER.search(raw) is None):
        return raw.translate(None, b" \t\r\n").decode()
    value = _any.decode(raw)
    if isinstance(value, str) and value[:1] in ("[", "{"):
        with contextlib.suppress(msgspec.DecodeError):
            value = _any.decode(value)
    return None if value is None else msgspec.json.encode(value).decode()


def _strings(values: Sequence[str | None]) -> pa.Array:
    """Dictionary-encoded while converting (one pass, no intermediate string array)."""
    if _all_none(values):
        return pa.nulls(len(values), _DICT)
    return pa.array(values, _DICT)

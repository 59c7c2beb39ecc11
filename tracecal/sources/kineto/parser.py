"""Kineto (torch.profiler) JSON -> one ``ParsedRank`` of Arrow record batches conforming to ``EVENTS``.

An ordinary document (an object, integer args written as integers, at most ``DIRECT_DECODE_BYTES``)
is decoded in one pass: its events by the strict decoder of ``events``, its metadata into the
keys of ``_METADATA``. Any other small one is first split by msgspec into its top-level keys as
undecoded ``msgspec.Raw`` slices (metadata is small; ``traceEvents`` stays bytes; every small scalar
key is kept), and its events then decoded. A larger document is never held whole: it is read as a
stream and its event array decoded a chunk at a time (``event_chunks``), so memory depends on the
chunk size, not on the file.

Handled eras (see docs/parsing.md): 2021 (``Operator``/``Runtime``/``Kernel`` categories, string tids such as
``"stream 7"``, lowercase ``Input dims`` / ``external id``, a top-level JSON array instead of an
object), 2022–23 (``cpu_op``/``cuda_runtime``/``kernel``, integer µs), 2024+ (float µs with
nanosecond precision, collective args on kernels, ``python_function``, ``cuda_driver``...).

Timestamps are stored as written (µs -> ns): in every shared 2024+ trace ``ts`` is the host's
monotonic clock, not an offset from ``baseTimeNanoseconds`` (which is kept in the metadata).
"""

from __future__ import annotations

import gc
import itertools
import os
import re
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from tracecal.errors import TraceFormatError
from tracecal.ingest.event_chunks import open_document
from tracecal.ingest.files import trace_blocks
from tracecal.ingest.trace import SHARD_PARQUET, EventsFile, ParsedRank
from tracecal.sources.kineto.events import BATCH_SCHEMA, StrictEvent, decode_events, events_to_batch

DIRECT_DECODE_BYTES = 256 * 2**20
"""Documents up to this size are read whole and decoded in one call; larger ones as a stream."""

CHUNK_EVENTS = 131_072
"""Most decoded events turned into one record batch: a streamed chunk (``event_chunks.CHUNK_BYTES``,
80 000-130 000 events) converts whole, so its batch needs no second pass to unify the dictionaries of
smaller ones (converting it in small pieces and combining them costs more than it saves); the Structs
are still transposed a cache-sized block at a time (``events.TRANSPOSE_ROWS``). A document decoded
in one call is converted this many events at a time, which bounds the per-field lists of a chunk
(a pointer per event and field) to a few tens of MB."""

_ERA_2021 = frozenset({"Operator", "Runtime", "Kernel", "Memcpy", "Memset"})
_ERA_2024_FLOWS = frozenset({"ac2g", "fwdbwd"})


class _DistributedInfo(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: list[dict[str, Any]] | None = None
    nccl_version: str | None = None


class _DeviceProperties(msgspec.Struct):
    id: int | None = None
    name: str | None = None


_METADATA: dict[str, Any] = {
    key: str | int | float | bool | None
    for key in [
        "schemaVersion",
        "displayTimeUnit",
        "baseTimeNanoseconds",
        "traceName",
        "trace_id",
        "host_name",
        "record_shapes",
        "with_stack",
        "profile_memory",
        "with_flops",
        "with_modules",
        "cuda_runtime_version",
        "cuda_driver_version",
        "cupti_version",
        "roctracer_version",
        "hip_runtime_version",
        "hip_driver_version",
    ]
}
"""Kineto's own top-level metadata keys, kept when a document is decoded in one pass."""

_Document = msgspec.defstruct(
    "_Document",
    [
        ("traceEvents", list[StrictEvent]),
        ("distributedInfo", _DistributedInfo | None, None),
        ("deviceProperties", list[_DeviceProperties] | None, None),
        *((key, type_, None) for key, type_ in _METADATA.items()),
    ],
    module=__name__,
)
_document = msgspec.json.Decoder(_Document)
_raw_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
_any = msgspec.json.Decoder()


def parse_kineto_file(path: Path, spill_dir: Path | None = None) -> ParsedRank:
    """Parse one Kineto JSON trace of one rank (``.json`` or ``.json.gz``) into a ``ParsedRank``:
    ``parse_kineto_ranks`` for a file that holds one rank.

    Raises:
        TraceFormatError: as ``parse_kineto_ranks``, and when the file holds several ranks.
    """
    ranks = parse_kineto_ranks(path, spill_dir)
    if len(ranks) != 1:
        raise TraceFormatError(f"{path}: holds {len(ranks)} ranks; read it with parse_kineto_ranks")
    return ranks[0]


def parse_kineto_ranks(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
    """Parse one Kineto JSON trace (``.json`` or ``.json.gz``) into one ``ParsedRank`` per rank it holds.

    A trace is one rank, unless its processes are ranks (``ranks_of_processes``): a merged trace or a
    ``tracecal export`` file names each rank's process ``rank N``, and its events are split by process.

    The rank is ``distributedInfo.rank`` when the trace has it, else None (the loader assigns it
    from the path). Times are int64 ns: ``round(ts_µs × 1000)``, exact for integer µs and without
    float truncation for float µs. A document above ``DIRECT_DECODE_BYTES`` is read as a stream
    (``event_chunks``); with ``spill_dir`` its events go to a Parquet file there as they are decoded
    (``ParsedRank.events`` is then an ``EventsFile``), so memory does not grow with the file.

    Raises:
        TraceFormatError: corrupt gzip, invalid or truncated JSON, JSON that is not a Kineto trace,
            no complete events, a complete event without ``ts``/``name`` (file, event index, key), or
            several processes that ran CPU operators without metadata naming their ranks.
    """
    facts = _RankFacts()
    blocks = facts.counted(trace_blocks(path))
    first: deque[bytes] = deque()
    while facts.source_bytes <= DIRECT_DECODE_BYTES and (block := next(blocks, None)) is not None:
        first.append(block)
    with _gc_paused():
        if facts.source_bytes <= DIRECT_DECODE_BYTES:
            data = first[0] if len(first) == 1 else b"".join(first)
            first.clear()
            header, event_batches = _whole_document(path, data)
            del data
            events: pa.Table | EventsFile = _collect(path, event_batches, facts)
        else:  # the blocks read so far are streamed too (never joined), each dropped once copied
            head = first.popleft() if first else b""
            document, chunks = open_document(path, head, chain(_drained(first), blocks), partial(decode_events, path))
            del head
            events = _collect(path, chunks, facts) if spill_dir is None else _spill(path, chunks, facts, spill_dir)
            header = {} if document.top_level_array else _split_document(path, document.header())[0]
    era = _era(facts.categories, facts.float_ts, header)
    ranks = ranks_of_processes(path, facts.processes, facts.cpu_pids)
    if ranks is None:
        return [_parsed_rank(path, header, events, facts, era)]
    return _split_ranks(path, header, events, facts, era, ranks)


RANK_PROCESS = re.compile(r"(?i)(?<![a-z0-9])rank[ _-]?(\d+)(?![0-9])(?!.*predicted)")
"""A process's name or label that says which rank it is (``rank 3``, as ``tracecal export`` writes);
a predicted timeline beside it (``rank 3 (predicted)``) is not that rank."""


def ranks_of_processes(path: Path, processes: dict[int, list[str]], cpu_pids: dict[int, int]) -> dict[int, int] | None:
    """pid -> rank when the trace's processes are ranks: at least two processes named ``rank N``
    (``RANK_PROCESS``) in ``process_name``/``process_labels`` metadata. None for a trace of one rank.

    Raises:
        TraceFormatError: several processes ran CPU operators but not each is named as a rank, or two
            processes name the same rank: the ranks cannot be told apart (the message says how to split).
    """
    named: dict[int, int] = {}
    for pid, texts in processes.items():
        found = {int(m.group(1)) for text in texts if (m := RANK_PROCESS.search(text))}
        if len(found) == 1:
            named[pid] = found.pop()
    unnamed = sorted(pid for pid in cpu_pids if pid not in named)
    if len(named) < 2 and len(cpu_pids) < 2:
        return None
    clash = len(set(named.values())) != len(named)
    if unnamed or clash:
        why = (
            f"processes {', '.join(map(str, sorted(named)))} name the same rank"
            if clash and not unnamed
            else f"{len(cpu_pids)} processes ran CPU operators (pids {', '.join(map(str, sorted(cpu_pids)[:8]))}) "
            "and not every one is named 'rank N' in its process_name or process_labels metadata"
        )
        raise TraceFormatError(
            f"{path}: holds several ranks that cannot be told apart ({why}); split it into one trace per rank "
            "(each with distributedInfo.rank, or named rank-N), or label each rank's process 'rank N'; "
            "a tracecal export is written split with --split-ranks"
        )
    return named


def _split_ranks(
    path: Path,
    header: dict[str, Any],
    events: pa.Table | EventsFile,
    facts: _RankFacts,
    era: str,
    ranks: dict[int, int],
) -> list[ParsedRank]:
    """One ``ParsedRank`` per rank process: its events (every event of the file sits on a rank's pid,
    else the file is refused), the rest of what the file says shared."""
    pids = pa.array(sorted(ranks), pa.int64())
    table = events if isinstance(events, pa.Table) else None
    stray = (
        pc.sum(pc.invert(pc.fill_null(pc.is_in(table.column("pid"), pids), False))).as_py()
        if table is not None
        else _stray_rows(events, pids)
    )
    if stray:
        raise TraceFormatError(
            f"{path}: {stray} events sit outside the processes named 'rank N' ({len(ranks)} ranks); cannot tell "
            "their rank: split it into one trace per rank (each with distributedInfo.rank, or named rank-N)"
        )
    parts: dict[int, tuple[pa.Table | EventsFile, set[int]]] = (
        {pid: _with_devices(table.filter(pc.equal(table.column("pid"), pid))) for pid in ranks}
        if table is not None
        else _split_events_file(events, ranks)
    )
    out = []
    for pid, rank in sorted(ranks.items(), key=lambda item: item[1]):
        part, devices = parts[pid]
        own = _RankFacts()
        rows = part.num_rows if isinstance(part, pa.Table) else part.rows
        own.source_bytes = facts.source_bytes * rows // max(facts.rows, 1)  # the file's bytes, shared by events
        own.cpu_pids = {pid: facts.cpu_pids.get(pid, 0)}
        own.devices = devices
        parsed = _parsed_rank(path, dict(header), part, own, era)
        out.append(replace(parsed, rank=rank, rank_source="process_name"))
    return out


def _with_devices(part: pa.Table) -> tuple[pa.Table, set[int]]:
    return part, set(pc.unique(part.column("device").drop_null()).to_pylist())


def _stray_rows(events: EventsFile, pids: pa.Array) -> int:
    import pyarrow.parquet as pq

    stray = 0
    for batch in pq.ParquetFile(events.path).iter_batches(columns=["pid"]):
        stray += batch.num_rows - int(pc.sum(pc.fill_null(pc.is_in(batch.column("pid"), pids), False)).as_py() or 0)
    return stray


def _split_events_file(events: EventsFile, ranks: dict[int, int]) -> dict[int, tuple[EventsFile, set[int]]]:
    """A spilled multi-rank file's events, one Parquet file per rank (with the devices its events ran
    on), written in one pass over the spilled file; the original is deleted."""
    import pyarrow.parquet as pq

    source = pq.ParquetFile(events.path)
    targets = {pid: events.path.with_suffix(f".rank{rank}.parquet") for pid, rank in ranks.items()}
    writers = {pid: pq.ParquetWriter(t, source.schema_arrow, **SHARD_PARQUET) for pid, t in targets.items()}
    counts = dict.fromkeys(ranks, 0)
    kernels = dict.fromkeys(ranks, 0)
    devices: dict[int, set[int]] = {pid: set() for pid in ranks}
    try:
        for batch in source.iter_batches():
            pid_column = batch.column("pid")
            for pid, writer in writers.items():
                part = batch.filter(pc.fill_null(pc.equal(pid_column, pid), False))
                if part.num_rows:
                    writer.write_batch(part)
                    counts[pid] += part.num_rows
                    kernels[pid] += int(pc.sum(pc.equal(part.column("kind").cast(pa.string()), "kernel")).as_py() or 0)
                    devices[pid].update(pc.unique(part.column("device").drop_null()).to_pylist())
    except BaseException:
        for writer in writers.values():
            writer.close()
        for target in targets.values():
            target.unlink(missing_ok=True)
        raise
    for writer in writers.values():
        writer.close()
    events.path.unlink(missing_ok=True)
    return {pid: (EventsFile(targets[pid], counts[pid], kernels[pid]), devices[pid]) for pid in ranks}


def _drained(blocks: deque[bytes]) -> Iterator[bytes]:
    """The blocks of ``blocks``, each removed from it as it is taken."""
    while blocks:
        yield blocks.popleft()


def _whole_document(path: Path, data: bytes) -> tuple[dict[str, Any], Iterator[tuple[int, list[Any], bool]]]:
    """Header and events of a document held whole: decoded in one pass when it is ordinary, else
    split first (2021, lenient or damaged: the general path, which also words the errors)."""
    whole = _decode_whole(data)
    if whole is not None:
        return whole[0], iter([(0, whole[1], True)])
    header, events_array = _split_document(path, data)
    return header, iter([(0, *decode_events(path, events_array, 0))])


def _record_batches(
    path: Path, event_batches: Iterator[tuple[int, list[Any], bool]], facts: _RankFacts
) -> Iterator[pa.RecordBatch]:
    """Each decoded list of events (``(offset, events, strict)``) as one record batch (its dictionaries
    unified), facts noted; each list is dropped once converted, before the next is decoded."""
    for offset, events, strict in event_batches:
        facts.float_ts = facts.float_ts or _float_timestamps(events[:1000])
        parts = [
            events_to_batch(path, events[a:b], offset + a, strict, facts.categories, facts.processes)
            for a, b in _chunks(len(events))
        ]
        del events
        if len(parts) > 1:  # one batch again, its dictionaries unified: the loader and decode get
            # what one conversion would give (chunks cost DuckDB and polars more)
            parts = pa.Table.from_batches(parts).combine_chunks().to_batches()
        for batch in parts:
            if batch.num_rows:
                facts.add(batch)
                yield batch


def _collect(path: Path, event_batches: Iterator[tuple[int, list[Any], bool]], facts: _RankFacts) -> pa.Table:
    batches = list(_record_batches(path, event_batches, facts))
    if not batches:
        raise _no_events(path)
    return pa.Table.from_batches(batches)


def _spill(
    path: Path, event_batches: Iterator[tuple[int, list[Any], bool]], facts: _RankFacts, spill_dir: Path
) -> EventsFile:
    """The events written to a Parquet file in ``spill_dir`` batch by batch (deleted on failure)."""
    import pyarrow.parquet as pq

    target = spill_dir / f"{path.name}.{os.getpid()}.{next(_SPILLS)}.parquet"
    try:
        with pq.ParquetWriter(target, BATCH_SCHEMA, **SHARD_PARQUET) as writer:
            for batch in _record_batches(path, event_batches, facts):
                writer.write_batch(batch)
        if not facts.rows:
            raise _no_events(path)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return EventsFile(target, facts.rows, facts.kernels)


_SPILLS = itertools.count()


def _no_events(path: Path) -> TraceFormatError:
    return TraceFormatError(
        f"{path}: no complete (ph X) events; is this a torch.profiler trace with activities recorded?"
    )


class _RankFacts:
    """What is learned of a rank while its batches go by: rows, kernels, the categories and whether
    any timestamp is a float (the era), CPU operators per pid (the main pid), the devices used."""

    def __init__(self) -> None:
        self.rows = self.kernels = 0
        self.source_bytes = 0
        self.categories: set[str | None] = set()
        self.float_ts = False
        self.cpu_pids: dict[int, int] = {}
        self.devices: set[int] = set()
        self.processes: dict[int, list[str]] = {}

    def counted(self, blocks: Iterator[bytes]) -> Iterator[bytes]:
        """``blocks``, their bytes added to ``source_bytes`` as they are read."""
        for block in blocks:
            self.source_bytes += len(block)
            yield block

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        kind, pid = batch.column("kind"), batch.column("pid")
        values = kind.dictionary.to_pylist()
        self.kernels += _count_codes(kind, [i for i, v in enumerate(values) if v == "kernel"])
        codes = [i for i, v in enumerate(values) if v == "cpu_op"]
        if codes:  # the code of cpu_op is compared, not every decoded string
            counts = pc.value_counts(pid.filter(pc.is_in(kind.indices, pa.array(codes, kind.indices.type))).drop_null())
            for row in counts.to_pylist():
                self.cpu_pids[row["values"]] = self.cpu_pids.get(row["values"], 0) + row["counts"]
        self.devices.update(pc.unique(batch.column("device").drop_null()).to_pylist())

    def main_pid(self) -> int | None:
        """The process that ran most CPU operators (the training process); the first seen on a tie."""
        if not self.cpu_pids:
            return None
        return int(max(self.cpu_pids.items(), key=lambda item: item[1])[0])


def _count_codes(column: pa.DictionaryArray, codes: list[int]) -> int:
    if not codes:
        return 0
    return int(pc.sum(pc.is_in(column.indices, pa.array(codes, column.indices.type))).as_py() or 0)


def _float_timestamps(events: list[Any]) -> bool:
    """Whether any of ``events`` writes ``ts`` as a float (an ``IncompleteEvent`` has none)."""
    return float in set(map(type, map(getattr, events, repeat("ts"), repeat(None))))


def _chunks(n: int) -> list[tuple[int, int]]:
    """(start, stop) of the chunks ``n`` decoded events are converted in (``CHUNK_EVENTS``)."""
    if n <= 2 * CHUNK_EVENTS:
        return [(0, n)]
    return [(start, min(start + CHUNK_EVENTS, n)) for start in range(0, n, CHUNK_EVENTS)]


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while millions of acyclic objects are made: each collection would walk
    all of them (it halves parse time); restored on exit."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _decode_whole(data: bytes) -> tuple[dict[str, Any], list[Any]] | None:
    """Header and ``StrictEvent`` list of an ordinary document in one decoding pass, or None when the
    general path must read it: above ``DIRECT_DECODE_BYTES``, a 2021 top-level array, integer args
    written as text or floats, a metadata key of another type, or anything invalid. Saves the pass
    that first splits the document into raw slices (5–7 % of a parse); keeps only the metadata keys
    of ``_METADATA``."""
    if len(data) > DIRECT_DECODE_BYTES or data[:64].lstrip()[:1] != b"{":
        return None
    try:
        document: Any = _document.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    header: dict[str, Any] = {key: getattr(document, key) for key in _METADATA}
    header = {k: v for k, v in header.items() if v is not None and not (isinstance(v, str) and len(v) > 250)}
    if document.distributedInfo is not None:
        header["distributedInfo"] = document.distributedInfo
    if document.deviceProperties is not None:
        header["deviceProperties"] = document.deviceProperties
    return header, document.traceEvents


def _split_document(path: Path, data: bytes) -> tuple[dict[str, Any], msgspec.Raw | bytes]:
    """Top-level metadata (small values decoded) and the undecoded events array."""
    start = data[:64].lstrip()[:1]
    if start == b"[":  # 2021 traces: the document is the event array itself
        return {}, data
    if start != b"{":
        raise TraceFormatError(f"{path}: not JSON (starts with {data[:16]!r}); expected a torch.profiler trace")
    try:
        top = _raw_object.decode(data)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: invalid JSON ({exc}); the file is truncated or corrupt") from exc
    events = top.pop("traceEvents", None)
    if events is None or bytes(memoryview(events)[:1]) != b"[":
        keys = ", ".join(sorted(top)[:5]) or "none"
        raise TraceFormatError(
            f"{path}: JSON but not a Kineto trace (no traceEvents array; top-level keys: {keys}); "
            "move it out of the run or pass --on-error skip"
        )
    header: dict[str, Any] = {}
    for key, raw in top.items():
        try:
            if key == "distributedInfo":
                header[key] = msgspec.json.decode(raw, type=_DistributedInfo)
            elif key == "deviceProperties":
                header[key] = msgspec.json.decode(raw, type=list[_DeviceProperties])
            elif len(raw) <= 256:  # small metadata only: host name, versions, base time
                value = _any.decode(raw)
                if isinstance(value, (str, int, float, bool)):
                    header[key] = value
        except msgspec.ValidationError as exc:
            raise TraceFormatError(f"{path}: malformed {key} ({exc})") from exc
    return header, events


def _era(categories: set[str | None], float_ts: bool, header: dict[str, Any]) -> str:
    if categories & _ERA_2021:
        return "2021"
    if float_ts or categories & _ERA_2024_FLOWS or "baseTimeNanoseconds" in header:
        return "2024"
    return "2022"


def _parsed_rank(
    path: Path, header: dict[str, Any], events: pa.Table | EventsFile, facts: _RankFacts, era: str
) -> ParsedRank:
    dist: _DistributedInfo | None = header.pop("distributedInfo", None)
    devices: list[_DeviceProperties] = header.pop("deviceProperties", None) or []
    if dist is not None and dist.nccl_version:
        header["nccl_version"] = dist.nccl_version
    host = header.get("host_name")
    return ParsedRank(
        rank=dist.rank if dist is not None else None,
        rank_source="distributedInfo" if dist is not None and dist.rank is not None else "",
        events=events,
        file=path,
        file_bytes=path.stat().st_size,
        format="kineto",
        world_size=dist.world_size if dist is not None else None,
        backend=dist.backend if dist is not None else None,
        host=host if isinstance(host, str) else None,
        pid=facts.main_pid(),
        device_name=_device_name(facts.devices, devices),
        schema_era=era,
        process_groups=list(dist.pg_config or []) if dist is not None else [],
        metadata=header,
        source_bytes=facts.source_bytes,
    )


def _device_name(used: set[int], devices: list[_DeviceProperties]) -> str | None:
    """Name of the GPU the rank's kernels ran on (deviceProperties lists every visible GPU)."""
    if not devices:
        return None
    for d in devices:
        if d.id in used and d.name:
            return d.name
    return devices[0].name if len(devices) == 1 else None

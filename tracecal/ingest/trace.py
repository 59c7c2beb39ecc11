"""What a parser hands over for one rank: its events as Arrow and the facts known about the rank.

Every file source (``tracecal.sources``: Kineto, one rank per file; Nsight, one or several) produces
``ParsedRank`` objects, and a folder source (GPUModeling25 decoded runs) a ``FolderRun`` of them;
everything after that is format-independent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracecal.schema import EVENTS
from tracecal.vocabulary import ParallelLayout

SHARD_PARQUET: dict[str, Any] = {
    "compression": "lz4",
    "write_statistics": ["ts_ns"],
    "use_dictionary": [column.name for column in EVENTS.columns if column.sql_type == "VARCHAR"],
}
"""How a rank's events are written to Parquet (a spill, a shard, one rank of a split file): lz4;
min/max statistics of ``ts_ns`` alone, so that a decode window's range read
(``sql/queries/decode_window_events.sql``) skips the row groups outside it instead of scanning the
whole shard once per window (the other columns' statistics would only cost time); dictionary pages
for the text columns alone, as the ids and times are nearly all distinct (a dictionary of them is
built, then dropped for plain pages when it outgrows its page: work for nothing)."""


@dataclass(frozen=True)
class EventsFile:
    """A rank's events in a Parquet file: ``EVENTS`` columns, ``run_id`` and ``rank`` null. A parser
    that streams a rank too large to hold writes it; whoever loads it deletes it.

    Attributes:
        path: the Parquet file.
        rows: events in it.
        kernels: events of kind ``kernel``.
    """

    path: Path
    rows: int
    kernels: int


@dataclass(frozen=True)
class ParsedRank:
    """One rank's trace after parsing.

    Attributes:
        rank: global rank, or None when the file itself does not say (discovery then assigns it
            from the path and records ``rank_source``).
        rank_source: where ``rank`` came from (``distributedInfo``, ``path``, ``nvtx``, ``nsys_order``).
        events: record batches conforming to ``tracecal.schema.EVENTS`` with ``run_id`` left null
            (the loader fills it), or an ``EventsFile`` holding them; ``event_id`` is the event's
            index within the rank.
        file: the source file.
        file_bytes: size of the file on disk.
        format: ``kineto`` or ``nsys``.
        world_size: from the trace (distributedInfo.world_size) or None.
        backend: distributed backend (nccl, gloo) or None.
        host, pid, device_name: what the trace says about where it ran (None when absent).
        schema_era: ``2021``, ``2022``, ``2024`` for Kineto category eras, ``nsys-<version>`` for Nsight.
        process_groups: ``distributedInfo.pg_config`` entries (pg_name, pg_desc, pg_size, ranks) or [].
        metadata: other top-level trace metadata worth keeping (small values only).
        source_bytes: bytes of the decoded document (the uncompressed size of a ``.gz`` trace),
            the basis of MB/s figures; None when the parser does not know it.
    """

    rank: int | None
    rank_source: str
    events: pa.Table | EventsFile
    file: Path
    file_bytes: int
    format: str
    world_size: int | None = None
    backend: str | None = None
    host: str | None = None
    pid: int | None = None
    device_name: str | None = None
    schema_era: str | None = None
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    source_bytes: int | None = None


@dataclass(frozen=True)
class FilesRead:
    """The files a folder source read for a run: paths, their bytes on disk, and the data rows of the
    tables among them (the ingest summary's files, MB and rows, since such a run has no rank files)."""

    paths: tuple[Path, ...]
    bytes: int
    table_rows: int


@dataclass(frozen=True)
class FolderRun:
    """What a folder source hands over for a whole run (``tracecal.sources.registry.Source.read_folder``):
    the ranks it rebuilt from the folder, the layout the folder states (with the run's metadata), what
    it noticed while reading, and the files it read. Its ranks are all the run has: none is reported
    missing.
    """

    ranks: list[ParsedRank]
    layout: ParallelLayout
    notes: list[str]
    read: FilesRead

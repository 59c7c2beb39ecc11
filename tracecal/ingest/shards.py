"""Parsing one trace file for the loader: the task every executor runs (``tracecal.ingest.executors``).

A rank that crosses a process boundary (a worker process, a Dask worker) travels as a Parquet shard
(``EventsFile``: the path and its counts) beside the rank's small fields, never as a pickled table;
the loader inserts the shard with ``read_parquet`` and deletes it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracecal.ingest.parse import parse_trace_file
from tracecal.ingest.trace import SHARD_PARQUET, EventsFile, ParsedRank
from tracecal.schema import EVENTS, arrow_schema


def parse_for_loader(path: Path, shard_dir: Path, every_rank_to_shard: bool) -> list[ParsedRank]:
    """Parse ``path``; a rank too large to hold streams into a shard in a directory of its own
    under ``shard_dir``, and with ``every_rank_to_shard`` (results that cross a process boundary)
    so does every other rank.

    Raises:
        TracecalError: the file is not a readable trace (its message names the file).
    """
    # A directory per file keeps shard names unique across the nodes of a cluster (pids are not).
    own_dir = Path(tempfile.mkdtemp(prefix=f"{path.name}-", dir=shard_dir))
    ranks = parse_trace_file(path, own_dir)
    if not every_rank_to_shard:
        return ranks
    return [
        rank
        if isinstance(rank.events, EventsFile)
        else dataclasses.replace(rank, events=write_shard(rank.events, own_dir / f"rank-{i}.parquet"))
        for i, rank in enumerate(ranks)
    ]


def write_shard(events: pa.Table, target: Path) -> EventsFile:
    """``events`` as a Parquet shard with every ``EVENTS`` column (those a parser left out as NULL)."""
    for schema_field in arrow_schema(EVENTS):
        if schema_field.name not in events.schema.names:
            events = events.append_column(schema_field, pa.nulls(events.num_rows, schema_field.type))
    pq.write_table(events, target, **SHARD_PARQUET)
    return EventsFile(target, events.num_rows, count_kernels(events))


def count_kernels(events: pa.Table) -> int:
    """Events of kind ``kernel``."""
    kinds = events["kind"]
    if pa.types.is_dictionary(kinds.type):  # count the code, not the decoded strings
        return sum(_dictionary_count(chunk, "kernel") for chunk in kinds.chunks)
    return int(pc.sum(pc.equal(kinds, "kernel")).as_py() or 0)


def _dictionary_count(chunk: pa.DictionaryArray, value: str) -> int:
    codes = [i for i, v in enumerate(chunk.dictionary.to_pylist()) if v == value]
    if not codes:
        return 0
    return int(pc.sum(pc.is_in(chunk.indices, pa.array(codes, chunk.indices.type))).as_py() or 0)

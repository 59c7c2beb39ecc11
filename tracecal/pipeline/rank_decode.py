"""Parse and decode one trace file where it is parsed: the task every executor runs during ingest.

A worker (this process for ``-j1``, a pool process, a Dask worker) parses the file into one Parquet
shard per rank (``tracecal.ingest.shards``), then does the per-rank half of decoding each rank
(``tracecal.pipeline.decode.decode_rank_parts``) on a DuckDB of its own whose ``events`` view reads
the shard, so the queries, batches and windows are those of decoding a stored run. Operators go to a
second shard beside the first; the rank's collective instances and iteration spans (small frames)
travel back with it. The loader inserts both shards and does the cross-rank half once every rank is
in, so decoding scales with the workers and never holds more than a window of one rank.

Decoding a rank needs the run's parallel layout (collective roles). A worker assumes the layout known
before parsing (flags, run name, logs) or else the one its own rank's process groups tell, with the
world size its trace records (else one rank per file); the loader decodes a rank again from the
stored events when the layout of the whole run turns out otherwise (``DecodedRank.layout``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tracecal.errors import RankConflictError
from tracecal.ingest.discover import TraceFile, layout_from_process_groups, resolve_rank
from tracecal.ingest.shards import parse_for_loader
from tracecal.ingest.trace import EventsFile, ParsedRank
from tracecal.pipeline.decode import RankParts, decode_rank_parts
from tracecal.schema import OPERATORS, arrow_schema
from tracecal.sql.loaders import SHARD_RUN_ID, shard_as_events
from tracecal.vocabulary import ParallelLayout

WORKER_DUCKDB_MEMORY = "1GB"
"""Memory a worker's DuckDB may hold (its whole-rank queries, such as the window sizes and the intervals
that cross a window start, spill beyond it), so that a worker's memory does not grow with its rank."""


@dataclass(frozen=True)
class DecodePlan:
    """What a worker needs to decode the ranks it parses.

    Attributes:
        layout: the run's layout as known before parsing (flags, run name, logs).
        iteration_marker: the marker regex (None: ``ProfilerStep#N``), checked by the caller.
        files: trace files of the run (a rank's file without a rank in it is the run's only one).
    """

    layout: ParallelLayout
    iteration_marker: str | None
    files: int


@dataclass(frozen=True)
class DecodedRank:
    """One rank parsed and decoded by a worker.

    Attributes:
        parsed: the parsed rank; its events are a Parquet shard (``EventsFile``).
        rank: its global rank (``resolve_rank``) and ``rank_source`` where that came from.
        layout: the layout decode assumed (pp, tp, dp and world_size are what it read).
        operators: Parquet shard of the rank's ``OPERATORS`` rows (``run_id`` NULL).
        parts: the rank's collective instances, iteration spans and operator figures.
    """

    parsed: ParsedRank
    rank: int
    rank_source: str
    layout: ParallelLayout
    operators: Path
    parts: RankParts


def parse_and_decode(
    trace_file: TraceFile, shard_dir: Path, crosses_processes: bool, plan: DecodePlan
) -> list[ParsedRank | DecodedRank]:
    """Parse ``trace_file`` into shards and decode each of its ranks (``FileTask`` with a plan bound).

    A rank whose global rank the file and its path do not tell is returned parsed only (the loader
    reports it as it reports every rank conflict), as is a rank without events.

    Raises:
        TracecalError: the file is not a readable trace (its message names the file).
    """
    ranks = parse_for_loader(trace_file.path, shard_dir, True)
    out: list[ParsedRank | DecodedRank] = []
    for parsed in ranks:
        try:
            rank, source = resolve_rank(trace_file, parsed, len(ranks), plan.files)
        except RankConflictError:
            out.append(parsed)
            continue
        assert isinstance(parsed.events, EventsFile)  # parse_for_loader(..., every_rank_to_shard=True)
        # a rank without events has nothing to decode (the loader still stores its ranks row)
        out.append(_decode(parsed, rank, source, plan) if parsed.events.rows else parsed)
    return out


def assumed_layout(plan: DecodePlan, parsed: ParsedRank) -> ParallelLayout:
    """The layout a worker decodes ``parsed`` with (the loader's rule, on this rank's facts only)."""
    layout = plan.layout
    if not layout.known:
        layout = (layout_from_process_groups(parsed.process_groups) or ParallelLayout()).merged(layout)
    return replace(layout, world_size=parsed.world_size or plan.files)


def _decode(parsed: ParsedRank, rank: int, source: str, plan: DecodePlan) -> DecodedRank:
    events = parsed.events
    assert isinstance(events, EventsFile)  # parse_for_loader(..., every_rank_to_shard=True)
    layout = assumed_layout(plan, parsed)
    sink = _OperatorShard(events.path.with_name(f"{events.path.stem}.operators.parquet"))
    con = duckdb.connect(
        config={
            "threads": 1,
            "memory_limit": WORKER_DUCKDB_MEMORY,
            "temp_directory": str(events.path.parent),  # the shard's own directory, removed with it
            "enable_external_file_cache": False,  # the shard is read a window at a time: caching it whole defeats that
        }
    )
    try:
        shard_as_events(con, events.path, rank)
        parts = decode_rank_parts(
            con,
            SHARD_RUN_ID,
            [(rank, events.rows)],
            layout=layout,
            marker=plan.iteration_marker,
            write=sink.write,
        )
    finally:
        con.close()
        sink.close()
    return DecodedRank(parsed, rank, source, layout, sink.path, parts)


class _OperatorShard:
    """Decoded operators appended to one Parquet file of the ``OPERATORS`` columns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.schema = arrow_schema(OPERATORS)
        # read once, whole, by the loader's INSERT: no statistics to compute; dictionary pages for the
        # text columns only (a dictionary of the nearly distinct ids and times is built, then dropped)
        self.writer = pq.ParquetWriter(
            path,
            self.schema,
            compression="lz4",
            write_statistics=False,
            use_dictionary=[f.name for f in self.schema if pa.types.is_string(f.type)],
        )

    def write(self, ops: pl.DataFrame) -> None:
        table = pa.table([ops.get_column(c).to_arrow() for c in self.schema.names], names=self.schema.names)
        self.writer.write_table(table.cast(self.schema))

    def close(self) -> None:
        self.writer.close()

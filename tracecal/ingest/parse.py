"""One entry point for every source: ``parse_trace_file(path) -> list[ParsedRank]`` for a rank file,
``read_run_folder(...) -> FolderRun`` for a run folder; the registry says whose reader runs."""

from __future__ import annotations

from pathlib import Path

from tracecal.errors import TraceFormatError
from tracecal.ingest.trace import FolderRun, ParsedRank
from tracecal.sources.registry import load, rank_file_patterns, source_named, source_of_file
from tracecal.vocabulary import ParallelLayout


def parse_trace_file(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
    """Parse one rank file with the reader of the source its name belongs to.

    Kineto JSON (``.json``, ``.json.gz``) gives one rank, or one per rank process of a merged trace
    (``kineto.parser.ranks_of_processes``); an Nsight export (``.sqlite``, ``.sqlite.gz``,
    ``.nsys-rep``) may give several (one per process/GPU in the file). With ``spill_dir``, a rank too
    large to hold may have its events written to a Parquet file there (``ParsedRank.events`` is then an
    ``EventsFile``, which the caller deletes after loading it).

    Raises:
        TraceFormatError: the file is not a trace tracecal reads, or is damaged.
        InputNotFoundError: the file does not exist.
    """
    source = source_of_file(path)
    if source is None or source.parse is None:
        expected = ", ".join(rank_file_patterns())
        raise TraceFormatError(f"{path}: not a trace file tracecal reads (expected {expected})")
    ranks: list[ParsedRank] = load(source.parse)(path, spill_dir)
    return ranks


def read_run_folder(format_name: str, folder: Path, layout: ParallelLayout) -> FolderRun:
    """Read a run folder with the reader of the folder source ``format_name`` (``layout``: what
    discovery found, for values the folder does not state).

    Raises:
        InputNotFoundError, TraceFormatError: a part of the run is missing or malformed.
    """
    source = source_named(format_name)
    if source.read_folder is None:
        raise TraceFormatError(f"{folder}: source {format_name!r} reads rank files, not run folders")
    run: FolderRun = load(source.read_folder)(folder, layout)
    return run

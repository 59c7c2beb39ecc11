"""One entry point for every trace format: ``parse_trace_file(path) -> list[ParsedRank]``."""

from __future__ import annotations

from pathlib import Path

from tracecal.errors import TraceFormatError
from tracecal.ingest.discover import trace_format
from tracecal.ingest.trace import ParsedRank


def parse_trace_file(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
    """Parse one trace file, dispatching on its suffix.

    Kineto JSON (``.json``, ``.json.gz``) gives one rank, or one per rank process of a merged trace
    (``kineto.ranks_of_processes``); an Nsight export (``.sqlite``,
    ``.sqlite.gz``, ``.nsys-rep``) may give several (one per process/GPU in the file). With
    ``spill_dir``, a rank too large to hold has its events written to a Parquet file there
    (``ParsedRank.events`` is then an ``EventsFile``, which the caller deletes after loading it).

    Raises:
        TraceFormatError: the file is not a trace tracecal reads, or is damaged.
        InputNotFoundError: the file does not exist.
    """
    fmt = trace_format(path)
    if fmt == "kineto":
        from tracecal.sources.kineto.parser import parse_kineto_ranks

        return parse_kineto_ranks(path, spill_dir)
    if fmt == "nsys":
        from tracecal.sources.nsys.parser import parse_nsys_file

        return parse_nsys_file(path)
    raise TraceFormatError(
        f"{path}: not a trace file tracecal reads (expected *.json, *.json.gz, *.sqlite, *.sqlite.gz, *.nsys-rep)"
    )

"""Nsight Systems exports (``.sqlite``, ``.sqlite.gz``, ``.nsys-rep``): ``parser`` splits a file into ranks,
``export`` opens it, ``tables`` and ``nvtx`` map its tables to events, ``payload`` reads NVTX payloads."""

from tracecal.sources.registry import Source

SOURCE = Source(
    name="nsys",
    description="Nsight Systems exports and reports",
    suffixes=(".sqlite", ".sqlite.gz", ".nsys-rep"),
    shadowed_by=((".nsys-rep", (".sqlite", ".sqlite.gz")),),
    parse="tracecal.sources.nsys.parser:parse_nsys_file",
)
"""The Nsight Systems source (``tracecal.sources.registry``); a report whose SQLite export sits beside it
is the same rank, so only the export is read."""

"""What a decoded GPT-NeoX run folder is read from: its kernel and module-time tables and its log.

A decoded run has no trace files, so the ingest summary's files, rows and MB come from here: the
files of the layout ``decoded_run`` reads (see its module docstring) that are present in the job
folder, their size, and the data rows of their CSV tables.
"""

from __future__ import annotations

from pathlib import Path

from tracecal.ingest.trace import FilesRead
from tracecal.sources.gpumodeling25.read.decoded_run import BEST_BATCH_TABLES, POSITIONS, RUN_TABLES

_PATTERNS = (
    *(f"{i}/{name}.csv" for i in range(len(POSITIONS)) for name in (*RUN_TABLES, *BEST_BATCH_TABLES)),
    *(f"best_batch_statistics/{i}/{name}.csv" for i in range(len(POSITIONS)) for name in BEST_BATCH_TABLES),
    "module_times_*.csv",
    "best_batch/module_times_*.csv",
    "best_batch/compares.csv",
    "*.log",
)
"""The decoded-run layout, relative to the job folder (a rank folder may hold best-iteration tables)."""


def decoded_run_sources(job_dir: Path) -> FilesRead:
    """The files of a decoded run's job folder that ingest reads (those of the layout present)."""
    paths = sorted({p for pattern in _PATTERNS for p in job_dir.glob(pattern) if p.is_file()})
    rows = 0
    for path in paths:
        if path.suffix == ".csv":
            with path.open("rb") as f:
                rows += max(0, sum(1 for line in f if line.strip()) - 1)  # less the header
    return FilesRead(tuple(paths), sum(p.stat().st_size for p in paths), rows)

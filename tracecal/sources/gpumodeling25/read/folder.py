"""Recognising a decoded GPT-NeoX run folder (the GPUModeling25 source's ``folder`` in the registry)."""

from __future__ import annotations

from pathlib import Path

DECODED_FORMAT = "gpumodeling25"
"""``runs.format`` of a decoded GPT-NeoX run folder (per-kernel tables and a log, no traces)."""


def decoded_job_dir(path: Path) -> Path | None:
    """The job folder of a decoded GPT-NeoX run at ``path`` (the folder itself or its first job
    sub-folder holding a part of one), or None when ``path`` is not one. Any part of a decoded run
    makes it one (rank folders 0/1/2 of ``*.csv`` kernel tables, ``best_batch_statistics/``,
    ``best_batch/``, ``module_times_*.csv``), so that reading it can say which parts are missing
    (``decoded_run.missing_parts``) instead of "no trace files"."""
    if not path.is_dir():
        return None
    candidates = [path, *sorted(p for p in path.iterdir() if p.is_dir())]
    return next((job for job in candidates if _holds_decoded_parts(job)), None)


def _holds_decoded_parts(job: Path) -> bool:
    return (
        any((job / str(i)).is_dir() and any((job / str(i)).glob("*.csv")) for i in range(3))
        or (job / "best_batch_statistics").is_dir()
        or (job / "best_batch").is_dir()
        or any(job.glob("module_times_*.csv"))
    )

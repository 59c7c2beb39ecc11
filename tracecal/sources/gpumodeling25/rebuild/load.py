"""The GPUModeling25 source's folder reader: a decoded run folder rebuilt into the ranks the ingest stores.

Kernel-table rows whose CPU operator did not launch their kernel are found by decode's consistency
rules (``tracecal.decode.consistency``), so this module sits above decode.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tracecal.decode.consistency import misaligned_ops
from tracecal.ingest.trace import FolderRun
from tracecal.sources.gpumodeling25.read.files import decoded_run_sources
from tracecal.sources.gpumodeling25.rebuild.reconstruct import RebuiltRun, rebuild_run
from tracecal.vocabulary import ParallelLayout


def read_folder(job_dir: Path, layout: ParallelLayout) -> FolderRun:
    """Rebuild the decoded run in ``job_dir`` (``layout``: what the run's folder name says, used only for
    values the log does not state).

    Raises:
        InputNotFoundError, TraceFormatError: a table or the log is missing or malformed.
    """
    return as_folder_run(rebuild_run(job_dir, name_layout=layout, misaligned=misaligned_ops), job_dir)


def as_folder_run(rebuilt: RebuiltRun, job_dir: Path) -> FolderRun:
    """A rebuilt run (of the folder, or of it at another layout) as the ingest takes it: the run's
    metadata carried by its layout, and the files of ``job_dir`` it was read from."""
    layout = replace(rebuilt.layout, metadata=rebuilt.metadata)
    return FolderRun(rebuilt.ranks, layout, rebuilt.notes, decoded_run_sources(job_dir))

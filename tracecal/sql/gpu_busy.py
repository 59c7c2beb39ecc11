"""How busy a run's GPUs were in its best iteration: the share that says whether a run is GPU-bound.

A GPU trace's iteration time is the span of its GPU activities. When the GPU waits between kernels
for the CPU to launch them, that span measures the host, and predicting it well says little about
the kernel models. ``gpu_busy(con, run_id)`` gives each rank's busy share of the best iteration
(``queries/gpu_busy.sql``); ``is_gpu_bound`` applies the ``GPU_BOUND_SHARE`` rule the demo uses to
choose its headline (docs/workload.md#tracecal-demo).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from tracecal.sql.query_files import query_text

GPU_BOUND_SHARE = 0.85
"""A rank whose GPU is busy at least this share of the iteration is GPU-bound: its iteration time is
mostly kernels, which is what the calibrated models predict."""


@dataclass(frozen=True)
class GpuBusy:
    """One rank's GPU activity in the best iteration."""

    rank: int
    iteration: int
    iteration_ns: int
    busy_ns: int
    busy_share: float


def gpu_busy(con: duckdb.DuckDBPyConnection, run_id: str) -> list[GpuBusy]:
    """Per rank (ascending), the GPU-busy share of ``run_id``'s best iteration; empty for a CPU-only
    run or one not in the database."""
    rows = con.execute(query_text("gpu_busy"), [run_id]).fetchall()
    return [GpuBusy(int(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4])) for r in rows]


def is_gpu_bound(busy_share: float) -> bool:
    """Whether a rank with this busy share is GPU-bound (``GPU_BOUND_SHARE``)."""
    return busy_share >= GPU_BOUND_SHARE

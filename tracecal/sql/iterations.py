"""What ``tracecal iterations RUN`` shows: per-iteration times, statistics, best iteration, clocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from tracecal.errors import RunNotFoundError
from tracecal.sql.connection import query_arrow
from tracecal.sql.query_files import query_file


@dataclass(frozen=True)
class IterationReport:
    """One run's iterations.

    Attributes:
        run_id: the run.
        iterations: ``queries/iterations_per_iteration.sql`` rows.
        stats: the run's ``iteration_stats`` row as a dict (empty when no iterations).
        best: the run's ``best_iteration`` row as a dict (empty when no iterations).
        clocks: ``queries/iterations_clocks.sql`` rows (offsets, residual skew, matched collectives).
        marker: the iteration-marker regex used at decode time.
        markers_found: False when some rank had no markers (its capture counts as one iteration).
    """

    run_id: str
    iterations: pa.Table
    stats: dict[str, Any]
    best: dict[str, Any]
    clocks: pa.Table
    marker: str | None
    markers_found: bool


def iteration_report(con: duckdb.DuckDBPyConnection, run_id: str) -> IterationReport:
    """Read the iteration report of ``run_id``.

    Raises:
        RunNotFoundError: the run is not in the database.
    """
    rows = con.execute("SELECT iteration_marker FROM runs WHERE run_id = ?", [run_id]).fetchall()
    if not rows:
        known = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id LIMIT 5").fetchall()]
        hint = f" (known: {', '.join(known)})" if known else ""
        raise RunNotFoundError(f"run {run_id!r} is not in the database{hint}; list runs with: tracecal runs")
    per = query_file(con, "iterations_per_iteration", [run_id])
    clocks = query_file(con, "iterations_clocks", [run_id])
    stats = query_arrow(con, "SELECT * FROM iteration_stats WHERE run_id = ?", [run_id]).to_pylist()
    best = query_arrow(con, "SELECT * FROM best_iteration WHERE run_id = ?", [run_id]).to_pylist()
    missing = con.execute("SELECT count(*) FROM iterations WHERE run_id = ? AND marker IS NULL", [run_id]).fetchall()
    return IterationReport(
        run_id=run_id,
        iterations=per,
        stats=stats[0] if stats else {},
        best=best[0] if best else {},
        clocks=clocks,
        marker=rows[0][0],
        markers_found=missing[0][0] == 0,
    )

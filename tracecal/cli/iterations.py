"""`tracecal iterations RUN`: per-iteration statistics, the best iteration, clock offsets."""

from __future__ import annotations

from typing import Annotated

import typer

from tracecal.cli.common import DbOption, render_arrow, render_rows, stdout, user_errors, warn
from tracecal.config import Settings


def _ms(ns: float | None) -> str:
    return "" if ns is None else f"{ns / 1e6:.3f}"


def iterations(
    run: Annotated[str, typer.Argument(help="Run id (see `tracecal runs`).")],
    db: DbOption = None,
) -> None:
    """Per-iteration times (slowest rank), min/max/mean/std, the best iteration, clock offsets and residual skew."""
    from tracecal.sql.connection import open_database
    from tracecal.sql.iterations import iteration_report

    with user_errors():
        settings = Settings.resolve(db)
        with open_database(settings.db_path, read_only=True) as con:
            report = iteration_report(con, run)
        if report.iterations.num_rows == 0:
            stdout.print(f"run {run} has no decoded iterations; re-ingest it with trace-ingest")
            return
        if not report.markers_found:
            warn(
                f"no iteration markers ({report.marker}) on some ranks of {run}: their capture counts as one iteration"
            )
        render_arrow(f"iterations of {run}", report.iterations)
        s = report.stats
        render_rows(
            "iteration time (slowest rank)",
            ["iterations", "min ms", "max ms", "mean ms", "std ms", "(mean-min)/min"],
            [
                [
                    s.get("iterations"),
                    _ms(s.get("min_ns")),
                    _ms(s.get("max_ns")),
                    _ms(s.get("mean_ns")),
                    _ms(s.get("std_ns")),
                    None if s.get("mean_vs_min") is None else f"{100 * s['mean_vs_min']:.1f} %",
                ]
            ],
        )
        b = report.best
        if b:
            stdout.print(
                f"best iteration: {b['iteration']}  ({_ms(b['dur_ns'])} ms on its slowest rank {b['slowest_rank']}, "
                f"{b['ranks']} ranks)"
            )
        if report.clocks.num_rows > 1:
            render_arrow("clock alignment (SPEC §5.5)", report.clocks)

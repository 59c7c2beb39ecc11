"""`tracecal iterations RUN`: per-iteration statistics, the best iteration, clock offsets; Table 8 for
decoded runs that carry a GPT-NeoX log."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tracecal.cli.common import DbOption, render_arrow, render_rows, stdout, user_errors, warn


def _ms(ns: float | None) -> str:
    return "" if ns is None else f"{ns / 1e6:.3f}"


def _s(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _render_table8(run: str, t8: dict[str, Any]) -> None:
    """Table 8 of GPUModeling25 (iteration time over the profiled iterations) and where each figure came from."""
    its = t8.get("iterations")
    pct = t8.get("mean_vs_min_pct")
    render_rows(
        f"Table 8: iteration time of {run}",
        ["iterations", "min s", "max s", "mean s", "std s", "(mean-min)/min %"],
        [
            [
                "" if not its else f"{len(its)} ({its[0]}-{its[-1]})",
                _s(t8.get("min_s")),
                _s(t8.get("max_s")),
                _s(t8.get("mean_s")),
                _s(t8.get("std_s")),
                "" if pct is None else f"{pct:.4f}",
            ]
        ],
    )
    by_source: dict[str, list[str]] = {}
    for figure, source in t8.get("source", {}).items():
        by_source.setdefault(source, []).append(figure)
    render_rows(None, ["figures", "source"], [[", ".join(names), source] for source, names in by_source.items()])
    if t8.get("missing"):
        why = (
            "the module-time tables give mean and min only"
            if t8.get("mean_s") is not None
            else "no module-time tables (module_times_average.csv / _min.csv) were stored with the run"
        )
        warn(
            f"Table 8 of {run} lacks {', '.join(t8['missing'])}: the GPT-NeoX log has no 'elapsed time per "
            f"iteration' lines for the profiled iterations and {why}"
        )
    if t8.get("missing_iterations"):
        warn(f"profiled iterations missing from the log of {run}: {t8['missing_iterations']}")


def iterations(
    run: Annotated[str, typer.Argument(help="Run id (see `tracecal runs`).")],
    db: DbOption = None,
) -> None:
    """Per-iteration times (slowest rank), min/max/mean/std, the best iteration, clock offsets and residual skew;
    for a run stored with its GPT-NeoX log, the Table 8 row (profiled iterations, seconds) and each figure's source."""
    from tracecal.api import Session

    with user_errors():
        full = Session(db).iterations_report(run)
        report = full.report
        if full.table8 is not None:
            _render_table8(run, full.table8)
            if report.iterations.num_rows == 0:
                return
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
            ["iterations", "min ms", "max ms", "mean ms", "std ms", "(mean-min)/min %"],
            [
                [
                    s.get("iterations"),
                    _ms(s.get("min_ns")),
                    _ms(s.get("max_ns")),
                    _ms(s.get("mean_ns")),
                    _ms(s.get("std_ns")),
                    None if s.get("mean_vs_min") is None else f"{100 * s['mean_vs_min']:.4f}",
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
            render_arrow("clock alignment", report.clocks)

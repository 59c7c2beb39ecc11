"""Error tables across runs, shaped like the published system's "Table 9" (see docs/published-runs.md) (pure).

Rows are components, columns are runs, cells are the error % of the run's component time summed over
its ranks (``overall``: the slowest rank's iteration time). Components a run does not have stay empty.
"""

from __future__ import annotations

import polars as pl

from tracecal.predict.components import ALL_COMPONENTS, run_summary

OVERALL = "overall"
"""Row label of the whole iteration (the published table calls it "Overall")."""


def error_table(components: pl.DataFrame) -> pl.DataFrame:
    """``components`` rows of several runs (run_id, rank, component, measured_ns, predicted_ns) ->
    one row per component with one error-% column per run (in first-seen run order)."""
    summary = run_summary(components)
    runs = list(dict.fromkeys(components["run_id"].to_list()))
    rows = []
    for comp in ALL_COMPONENTS:
        label = OVERALL if comp == "iteration" else comp
        cells: dict[str, float | str | None] = {"component": label}
        for run in runs:
            hit = summary.filter((pl.col("run_id") == run) & (pl.col("component") == comp))
            err = hit["error_pct"][0] if hit.height else None
            cells[run] = None if err is None else round(float(err), 2)
        rows.append(cells)
    frame = pl.DataFrame(rows, schema={"component": pl.String, **{r: pl.Float64 for r in runs}}, orient="row")
    # drop components that no run has (all empty), keep overall
    keep = [
        i
        for i, r in enumerate(frame.iter_rows(named=True))
        if r["component"] == OVERALL or any(r[x] is not None for x in runs)
    ]
    return frame[keep]


def times_table(components: pl.DataFrame) -> pl.DataFrame:
    """Long form behind ``error_table``: run_id, component, measured_ms, predicted_ms, error_pct."""
    return run_summary(components).select(
        "run_id",
        pl.col("component").replace("iteration", OVERALL),
        (pl.col("measured_ns") / 1e6).alias("measured_ms"),
        (pl.col("predicted_ns") / 1e6).alias("predicted_ms"),
        "error_pct",
    )


def to_markdown(table: pl.DataFrame, title: str | None = None) -> str:
    """A GitHub-flavoured Markdown table (error % with two decimals, empty when not applicable)."""
    cols = table.columns
    lines = [f"### {title}", ""] if title else []
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join("---" if c == "component" else "---:" for c in cols) + "|")
    for row in table.iter_rows():
        cells = [row[0]] + ["" if v is None else f"{v:+.2f}" for v in row[1:]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"

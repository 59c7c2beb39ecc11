"""`tracecal diff RUN_A RUN_B` and `tracecal diff RUN --predicted`: where the time went differently."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tracecal.cli.common import DbOption, render_rows, stdout, user_errors
from tracecal.errors import PredictionError

if TYPE_CHECKING:
    from tracecal.predict.diff import Diff

FORMATS = ("table", "csv", "json")


def diff(
    run_a: Annotated[str, typer.Argument(help="Run id A (the baseline).")],
    run_b: Annotated[str | None, typer.Argument(help="Run id B (omit with --predicted).")] = None,
    by: Annotated[str, typer.Option("--by", help="Group by family, name (operator / kernel) or component.")] = "family",
    predicted: Annotated[
        bool, typer.Option("--predicted", help="Compare RUN_A as measured with its replay by calibrated models.")
    ] = False,
    cluster: Annotated[
        str | None, typer.Option("--cluster", help="Cluster whose models predict (default: the run's cluster).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
    limit: Annotated[int, typer.Option("--limit", help="Rows shown in the table (csv/json: all).")] = 20,
    db: DbOption = None,
) -> None:
    """Time per group in A and B (best iteration, per-rank mean), the difference B − A, and the share of
    the iteration difference it explains, largest movers first. Components split each rank's iteration
    (idle included), so their shares add up to 100 %; operator groups overlap and need not."""
    from tracecal.api import Session

    with user_errors():
        if fmt not in FORMATS:
            raise PredictionError(f"unknown --format {fmt!r}; use one of {', '.join(FORMATS)}")
        result = Session(db).diff_report(run_a, run_b, by=by, predicted=predicted, cluster=cluster)
    if fmt == "csv":
        typer.echo(result.table.write_csv(float_precision=4), nl=False)
    elif fmt == "json":
        typer.echo(result.table.write_json())
    else:
        _render(result, limit)


def _render(result: Diff, limit: int) -> None:
    rows = [
        [
            r["group"],
            f"{r['a_ms']:.3f}",
            f"{r['b_ms']:.3f}",
            f"{r['diff_ms']:+.3f}",
            "" if r["share_pct"] is None else f"{r['share_pct']:.1f} %",
            r["status"],
        ]
        for r in result.table.head(limit).iter_rows(named=True)
    ]
    title = f"{result.b} vs {result.a} by {result.by} (per-rank mean, ms)"
    render_rows(title, [result.by, "A ms", "B ms", "B − A ms", "share of Δ iteration", "status"], rows)
    if result.table.height > limit:
        stdout.print(f"({result.table.height - limit} more groups; --limit N or --format csv for all)")
    stdout.print(
        f"iteration (per-rank mean): A {result.a_iteration_ms:.3f} ms ({result.a_ranks} ranks), "
        f"B {result.b_iteration_ms:.3f} ms ({result.b_ranks} ranks), Δ {result.iteration_diff_ms:+.3f} ms"
    )

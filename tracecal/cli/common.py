"""Pieces every command shares: the --db option, error handling, rendering, progress bars."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from tracecal.errors import TracecalError

DbOption = Annotated[
    Path | None,
    typer.Option("--db", help="DuckDB database (default: $TRACECAL_DB, else ./tracecal.duckdb)."),
]

stdout = Console()
stderr = Console(stderr=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a TracecalError into one line on stderr and exit status 2; let bugs keep their traceback."""
    try:
        yield
    except TracecalError as exc:
        stderr.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def show_progress() -> bool:
    """Progress bars only on an interactive terminal, so logs and pipes get no control codes."""
    return sys.stderr.isatty()


def progress_bar() -> Progress:
    """A rich progress bar on stderr with count, elapsed time and ETA; disabled off a terminal."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        disable=not show_progress(),
        transient=False,
    )


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.6g}"
    return str(value)


def render_rows(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as a rich table on stdout."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    stdout.print(table)


def render_arrow(title: str | None, table: Any, limit: int | None = None) -> None:
    """Print an Arrow table (optionally only its first ``limit`` rows) as a rich table."""
    shown = table if limit is None else table.slice(0, limit)
    rows = [list(r.values()) for r in shown.to_pylist()]
    render_rows(title, table.column_names, rows)
    if limit is not None and table.num_rows > limit:
        stderr.print(f"({table.num_rows - limit} more rows; use --format csv or --output to see all)")

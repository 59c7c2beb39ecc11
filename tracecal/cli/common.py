"""Pieces every command shares: the --db option, error handling, progress, and table rendering.

Tables follow one rule set (``render_rows``): on a terminal a table fits the terminal's width without
splitting a word or cutting a value — shorter headers first, then whole columns left out from the
right, and a line saying which; off a terminal (a pipe, a file, a CI log) every column is printed
whole at whatever width it needs. Each column has a kind that fixes how its numbers print, so a
column never mixes styles: times in ms with three decimals, percentages with two, shares (0–1) as
percent with one.
"""

from __future__ import annotations

import io
import math
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, Literal

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from tracecal.errors import TracecalError

DbOption = Annotated[
    Path | None,
    typer.Option("--db", help="DuckDB database (default: $TRACECAL_DB, else ./tracecal.duckdb)."),
]


class _Console(Console):
    """A console that wraps long lines on a terminal only: off one (a pipe, a log) each line is
    printed whole instead of at rich's default 80 columns. Decided at each print, as the stream is."""

    @property
    def soft_wrap(self) -> bool:
        return not self.is_terminal

    @soft_wrap.setter
    def soft_wrap(self, value: bool) -> None:
        """Console.__init__ sets it; the stream decides instead."""


stdout = _Console()
stderr = _Console(stderr=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a TracecalError, or DuckDB failing to read a file (a file of the database's event store
    moved or deleted, a disk error), into one line on stderr and exit status 2; let bugs keep their
    traceback."""
    try:
        yield
    except TracecalError as exc:
        stderr.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except Exception as exc:
        duckdb = sys.modules.get("duckdb")  # imported by whatever raised it; not at start-up
        if duckdb is None or not isinstance(exc, duckdb.IOException):
            raise
        message = str(exc).splitlines()[0]
        if "No files found" in message:
            message += (
                " (the database reads its events from the .events folder beside it: move that folder back "
                "beside the database, or ingest the run again)"
            )
        stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


APP_SETTINGS: dict[str, Any] = {
    "no_args_is_help": True,
    "pretty_exceptions_enable": False,
    "add_completion": False,
    "rich_markup_mode": None,  # plain click help: rewraps docstrings to the terminal width
}
"""How every tracecal entry point is set up, so `trace-ingest --help` reads like `tracecal ingest --help`."""


def one_command_app(command: Any) -> typer.Typer:
    """A console script of one command (``trace-ingest``, ``calibrate``) set up like ``tracecal``."""
    app = typer.Typer(**APP_SETTINGS)
    app.command()(command)
    return app


def warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


# -- progress ------------------------------------------------------------------------------------


def show_progress() -> bool:
    """Progress bars only on an interactive terminal, so logs and pipes get no control codes."""
    return stderr.is_terminal


class LineProgress:
    """The off-terminal stand-in for a rich ``Progress``: the same ``add_task`` / ``update`` calls,
    printed as one plain line on stderr each time a task starts a new step (its description changes)
    and when it completes, with the count and the seconds since the task began. No bars, no control
    codes: a CI log or ``2> file`` reads as a list of stages."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._tasks: dict[TaskID, dict[str, Any]] = {}

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_: Any) -> TaskID:
        task = TaskID(len(self._tasks))
        self._tasks[task] = {"description": description, "total": total, "completed": 0, "started": time.monotonic()}
        self._line(task)
        return task

    def update(
        self,
        task: TaskID,
        *,
        completed: float | None = None,
        total: float | None = None,
        description: str | None = None,
        advance: float | None = None,
        **_: Any,
    ) -> None:
        state = self._tasks[task]
        before = (state["description"], state["completed"] == state["total"])
        if total is not None:
            state["total"] = total
        if completed is not None:
            state["completed"] = completed
        if advance is not None:
            state["completed"] += advance
        if description is not None:
            state["description"] = description
        finished = state["total"] is not None and state["completed"] >= state["total"]
        if state["description"] != before[0] or (finished and not before[1]):
            self._line(task)

    def _line(self, task: TaskID) -> None:
        state = self._tasks[task]
        count = "" if state["total"] is None else f" {int(state['completed'])}/{int(state['total'])}"
        elapsed = time.monotonic() - state["started"]
        self._console.print(f"{state['description']}{count} ({elapsed:.0f} s)", highlight=False, soft_wrap=True)


def progress_bar() -> Progress | LineProgress:
    """Progress on stderr: a rich bar with count, elapsed time and ETA on a terminal; elsewhere one
    plain line per stage (``LineProgress``)."""
    if not show_progress():
        return LineProgress(stderr)
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=False,
    )


# -- tables --------------------------------------------------------------------------------------

Kind = Literal["text", "int", "num", "ms", "s", "mb", "pct", "signed_pct", "share"]
NUMERIC_KINDS = frozenset({"int", "num", "ms", "s", "mb", "pct", "signed_pct", "share"})


@dataclass(frozen=True)
class Col:
    """A table column.

    Attributes:
        header: the column's name (may wrap at its spaces on a narrow terminal).
        kind: how its values print (``format_value``); strings are printed as given whatever the kind.
        short: a shorter header used before any column is left out on a narrow terminal.
        keep: never left out (the first column, the row's key, is always kept).
    """

    header: str
    kind: Kind = "text"
    short: str | None = None
    keep: bool = False


def format_value(value: Any, kind: Kind = "text", decimals: int | None = None) -> str:
    """One cell as text. None and NaN are empty. ``ms``: three decimals; ``s``: two; ``mb``: one;
    ``pct``: two (``signed_pct`` with its sign); ``share``: a 0–1 fraction as percent with one
    decimal; ``num``: ``decimals`` fixed decimals (never an exponent); ``int``: whole number."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, str) or kind == "text" or isinstance(value, bool):
        return _text(value)
    if not isinstance(value, int | float):
        return str(value)
    if kind == "int" or (kind == "num" and isinstance(value, int)):
        return str(round(value))
    fixed = {"ms": "{:.3f}", "s": "{:.2f}", "mb": "{:.1f}", "pct": "{:.2f}", "signed_pct": "{:+.2f}"}
    if kind in fixed:
        return fixed[kind].format(value)
    if kind == "share":
        return f"{100 * value:.1f}"
    return f"{value:.{2 if decimals is None else decimals}f}"


def _text(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def column_decimals(values: Sequence[Any]) -> int:
    """Decimals for a column of plain numbers, the same for every value of the column: none when all
    are whole, else at least 2 and enough for three significant digits of the smallest non-zero
    magnitude (at most 6), so no value reads as an exponent or as 0."""
    floats = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    if all(v == int(v) for v in floats):
        return 0
    smallest = min(abs(v) for v in floats if v)
    return max(2, min(6, 2 - math.floor(math.log10(smallest))))


def _column(spec: str | Col) -> Col:
    return spec if isinstance(spec, Col) else Col(spec)


def _cells(columns: Sequence[Col], rows: Sequence[Sequence[Any]]) -> list[list[str]]:
    decimals = [
        column_decimals([row[i] for row in rows]) if col.kind == "num" else None for i, col in enumerate(columns)
    ]
    return [[format_value(v, col.kind, d) for v, col, d in zip(row, columns, decimals, strict=True)] for row in rows]


def _table(
    title: str | None,
    columns: Sequence[Col],
    cells: Sequence[Sequence[str]],
    headers: Sequence[str],
    widths: Sequence[int] | None = None,
) -> Table:
    """A rich table of the cells; ``widths`` fixes each column's width (a terminal), else each
    column is as wide as its widest value (a pipe)."""
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
        header_style="bold",
        title_justify="left",
    )
    for i, (col, header) in enumerate(zip(columns, headers, strict=True)):
        table.add_column(
            header,
            justify="right" if col.kind in NUMERIC_KINDS else "left",
            width=None if widths is None else widths[i],
        )
    for row in cells:
        table.add_row(*(escape(c) for c in row))
    return table


def _longest_word(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


def _column_widths(
    columns: Sequence[Col], cells: Sequence[Sequence[str]], headers: Sequence[str], room: int
) -> list[int] | None:
    """Widths that fit ``room`` characters of cells without splitting a word (a number is one
    word, a text cell may wrap at its spaces, a header too), or None when even that is too wide.
    Each column starts at its widest value; the one with the most to spare gives a character
    until the table fits."""
    least, widths = [], []
    for i, (col, header) in enumerate(zip(columns, headers, strict=True)):
        values = [row[i] for row in cells]
        words = [len(v) if col.kind in NUMERIC_KINDS else _longest_word(v) for v in values]
        least.append(max(_longest_word(header), *words, 1))
        widths.append(max(len(header), *(len(v) for v in values), 1))
    if sum(least) > room:
        return None
    while sum(widths) > room:
        spare = [w - m for w, m in zip(widths, least, strict=True)]
        widths[spare.index(max(spare))] -= 1
    return widths


def _fit(
    title: str | None, columns: Sequence[Col], cells: Sequence[Sequence[str]], width: int
) -> tuple[Table, list[str], list[str]]:
    """The widest table that fits ``width`` without splitting a word: full headers, else short ones,
    else columns left out from the right (never a kept one). Returns it with the abbreviated headers
    (``short = header``) and the headers left out."""
    shown = list(range(len(columns)))
    abbreviate = False
    while True:
        headers = [(columns[i].short or columns[i].header) if abbreviate else columns[i].header for i in shown]
        kept = [[row[i] for i in shown] for row in cells]
        # each column: its cells, one space of padding, and one of separator except the last
        widths = _column_widths([columns[i] for i in shown], kept, headers, width - 2 * len(shown) + 1)
        if widths is not None:
            break
        if not abbreviate and any(columns[i].short for i in shown):
            abbreviate = True
            continue
        droppable = [i for i in shown if i != 0 and not columns[i].keep]
        if not droppable:
            break  # even the kept columns are too wide: rich wraps them
        shown.remove(droppable[-1])
    table = _table(title, [columns[i] for i in shown], kept, headers, widths)
    short = [f"{columns[i].short} = {columns[i].header}" for i in shown if abbreviate and columns[i].short]
    dropped = [columns[i].header for i in range(len(columns)) if i not in shown]
    return table, short, dropped


def render_rows(title: str | None, columns: Sequence[str | Col], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as a table on stdout: fitted to a terminal (saying what was abbreviated or left
    out), whole anywhere else. ``columns``: headers, or ``Col`` for a kind, a short header or a kept
    column; values are formatted by their column's kind."""
    cols = [_column(c) for c in columns]
    cells = _cells(cols, rows)
    if not stdout.is_terminal:
        table = _table(title, cols, cells, [c.header for c in cols])
        width = Measurement.get(stdout, stdout.options.update_width(10**6), table).maximum
        whole = Console(file=io.StringIO(), width=max(width, 1), color_system=None, highlight=False)
        whole.print(table)
        lines = whole.file.getvalue().splitlines()  # type: ignore[attr-defined]
        stdout.file.write("".join(line.rstrip() + "\n" for line in lines))
        return
    table, short, dropped = _fit(title, cols, cells, stdout.width)
    stdout.print(table)
    notes = []
    if short:
        notes.append("abbreviated: " + ", ".join(short))
    if dropped:
        notes.append(
            f"left out to fit {stdout.width} columns: {', '.join(dropped)} (a wider terminal, or a pipe, shows them)"
        )
    for note in notes:
        stdout.print(f"({note})", style="dim", highlight=False)


def arrow_columns(table: Any) -> list[Col]:
    """Columns for an Arrow table: a kind from each column's type and name (``*_ms`` times,
    ``*_pct`` percentages, other floats fixed decimals per column)."""
    import pyarrow as pa

    cols = []
    for field in table.schema:
        kind: Kind = "text"
        if pa.types.is_integer(field.type):
            kind = "int"
        elif pa.types.is_floating(field.type) or pa.types.is_decimal(field.type):
            kind = "ms" if field.name.endswith("_ms") else "pct" if field.name.endswith("_pct") else "num"
        cols.append(Col(field.name, kind))
    return cols


def render_arrow(
    title: str | None, table: Any, limit: int | None = None, columns: Sequence[str | Col] | None = None
) -> None:
    """Print an Arrow table (optionally only its first ``limit`` rows) with ``render_rows``;
    ``columns`` overrides the columns derived from its schema (``arrow_columns``)."""
    shown = table if limit is None else table.slice(0, limit)
    rows = [[_plain(v) for v in r.values()] for r in shown.to_pylist()]
    render_rows(title, columns or arrow_columns(table), rows)
    if limit is not None and table.num_rows > limit:
        stderr.print(f"({table.num_rows - limit} more rows; use --format csv or --output to see all)")


def _plain(value: Any) -> Any:
    """Decimals from DuckDB's DECIMAL columns as floats, so they format like every other number."""
    from decimal import Decimal

    return float(value) if isinstance(value, Decimal) else value

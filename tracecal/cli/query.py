"""`tracecal sql` and `tracecal runs`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracecal.cli.common import Col, DbOption, render_arrow, stdout, user_errors
from tracecal.errors import InputNotFoundError


def sql(
    query: Annotated[str | None, typer.Argument(help='SQL to run, e.g. "select * from runs".')] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Read the SQL from this file.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, csv, json or parquet.")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the result to this file.")] = None,
    write: Annotated[bool, typer.Option("--write", help="Allow statements that change the database.")] = False,
    limit: Annotated[int, typer.Option(help="Rows shown in table format (files get all rows).")] = 100,
    db: DbOption = None,
) -> None:
    """Run SQL on the database (read-only unless --write). Tables: runs, ranks, events, operators,
    collectives, iterations, samples, models, predictions, components; views: see README."""
    from tracecal.api import Session
    from tracecal.sql.query import OUTPUT_FORMATS, QueryError, result_as_csv, result_as_json, write_result

    with user_errors():
        if (query is None) == (file is None):
            raise QueryError("give exactly one of: a SQL argument, or --file PATH")
        if file is not None and not file.is_file():
            raise InputNotFoundError(f"SQL file {file} does not exist")
        text = file.read_text() if file is not None else query or ""
        if fmt not in OUTPUT_FORMATS:
            raise QueryError(f"unknown --format {fmt!r}; use one of {', '.join(OUTPUT_FORMATS)}")
        if fmt == "parquet" and output is None:
            raise QueryError("--format parquet needs --output PATH")
        result = Session(db).sql_arrow(text, write=write)
        if output is not None:
            write_result(result, "csv" if fmt == "table" else fmt, output)
            stdout.print(f"wrote {result.num_rows} rows to {output}")
        elif fmt == "csv":
            typer.echo(result_as_csv(result), nl=False)
        elif fmt == "json":
            typer.echo(result_as_json(result), nl=False)
        else:
            render_arrow(None, result, limit=limit)


def runs(db: DbOption = None) -> None:
    """List ingested runs with ranks, events, capture span and source."""
    from tracecal.api import Session

    with user_errors():
        session = Session(db)
        table = session.runs().to_arrow()
        if table.num_rows == 0:
            stdout.print(f"no runs in {session.db_path}; ingest one with: trace-ingest RUN_DIR")
            return
        render_arrow(f"runs in {session.db_path}", table.select([c.header for c in RUNS_COLUMNS]), columns=RUNS_COLUMNS)


RUNS_COLUMNS = [
    Col("run_id", keep=True),
    Col("format", short="fmt"),
    Col("layout"),
    Col("ranks", "int"),
    Col("world_size", "int", short="world"),
    Col("events", "int"),
    Col("span_ms", "ms"),
    Col("cluster"),
    Col("ingested_at"),
    Col("source_path"),
]
"""The columns of `tracecal runs`, most useful first: a narrow terminal leaves out the last ones."""

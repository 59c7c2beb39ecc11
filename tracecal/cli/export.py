"""`tracecal export RUN`: a Chrome / Perfetto trace of a run, measured, replayed, or both side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracecal.cli.common import DbOption, stdout, user_errors, warn


def export(
    run: Annotated[str, typer.Argument(help="Run id (see `tracecal runs`).")],
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="FILE.json or FILE.json.gz (every rank), or a directory with --split-ranks."
        ),
    ],
    what: Annotated[
        str,
        typer.Option(
            "--what",
            help="measured (the stored events), predicted (the replay with calibrated models), or both "
            "(the replay as a second process per rank).",
        ),
    ] = "measured",
    iteration: Annotated[
        int | None,
        typer.Option("--iteration", help="Only this iteration (default: measured the whole run, else the best)."),
    ] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", help="Cluster whose models predict (default: the run's cluster).")
    ] = None,
    split_ranks: Annotated[
        bool,
        typer.Option(
            "--split-ranks",
            help="Write one Kineto trace per rank and run.json (the layout) into OUTPUT.",
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Write RUN as a trace that ui.perfetto.dev and chrome://tracing open: one process per rank, a thread
    per CPU thread and GPU stream, collectives linked across ranks by flow arrows, and the family, phase,
    component and measured / predicted durations of every operator in its args. The measured timeline
    is a Kineto trace: `trace-ingest` of the export (one file, or --split-ranks) gives back the same
    operators, collectives and iterations per rank."""
    from tracecal.api import Session

    with user_errors():
        result = Session(db).export(
            run, output, what=what, iteration=iteration, cluster=cluster, split_ranks=split_ranks
        )
        if result.tracks.moved_spans:
            warn(
                f"{result.tracks.moved_spans} spans overlapped a span of their thread without nesting in it; "
                f"they are on '(overlap k)' threads beside their own ({result.tracks.moved_tracks} threads)"
            )
        scope = "the whole run" if result.iteration is None else f"iteration {result.iteration}"
        where = result.files[0] if len(result.files) == 1 else f"{len(result.files)} files in {output}"
        stdout.print(f"wrote {what} {scope} of {run}: {result.ranks} ranks, {result.spans} spans to {where}")

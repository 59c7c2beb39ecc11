"""`tracecal samples`: measure microbenchmarks (`measure compute|comm`, in ``cli/sample.py``) and
manage the stored samples (`import|export|list|flag`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracecal.cli import sample as measure
from tracecal.cli.common import DbOption, progress_bar, render_arrow, render_rows, stdout, user_errors

app = typer.Typer(
    help="Microbenchmark samples: measure them here, or import, export, list and re-flag stored ones.",
    no_args_is_help=True,
)
app.add_typer(measure.app, name="measure")


@app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="gpumodeling25: a directory of published CSVs; parquet: a file or dir.")],
    cluster: Annotated[
        str | None,
        typer.Option(help="Cluster the samples belong to (required for gpumodeling25; filters parquet)."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="gpumodeling25 or parquet.")] = "gpumodeling25",
    db: DbOption = None,
) -> None:
    """Import samples measured elsewhere: the published GPUModeling25 CSVs (see docs/samples.md), or Parquet
    written by `tracecal samples export`. Re-importing replaces; a bad file writes nothing."""
    from tracecal.api import Session

    with user_errors():
        session = Session(db)
        if fmt != "gpumodeling25":  # one Parquet read: no steps to show
            result = session.samples_import_report(path, cluster=cluster, fmt=fmt)
        else:
            with progress_bar() as bar:
                task = bar.add_task("importing", total=None)

                def progress(done: int, total: int, label: str) -> None:
                    bar.update(task, completed=done, total=total, description=label)

                result = session.samples_import_report(path, cluster=cluster, fmt=fmt, progress=progress)
        if result.flags is not None:
            flags = ", ".join(f"{n} {reason}" for reason, n in result.flags.items()) or "none"
            stdout.print(
                f"imported {result.samples} samples from {result.files} files of {path} for cluster {cluster} "
                f"into {session.db_path}; flagged: {flags}"
            )
        else:
            stdout.print(f"imported {result.samples} samples from {path} into {session.db_path}")


@app.command("export")
def export(
    output: Annotated[Path, typer.Option("--output", "-o", help="Parquet file to write.")],
    cluster: Annotated[str | None, typer.Option(help="Only this cluster's samples (default: all).")] = None,
    db: DbOption = None,
) -> None:
    """Write samples to a Parquet file that `tracecal samples import FILE --format parquet` reads
    on another machine."""
    from tracecal.api import Session

    with user_errors():
        written = Session(db).samples_export(output, cluster=cluster)
        stdout.print(f"wrote {written} samples to {output}")


@app.command("list")
def list_(
    cluster: Annotated[str | None, typer.Option(help="Only this cluster.")] = None,
    db: DbOption = None,
) -> None:
    """Clusters, families, ops and sample counts, with flagged samples per reason."""
    from tracecal.api import Session

    with user_errors():
        session = Session(db)
        overview = session.samples_list(cluster=cluster).to_arrow()
        flags = session.samples_flags(cluster=cluster).to_arrow()
        if overview.num_rows == 0:
            where = f" of cluster {cluster}" if cluster else ""
            stdout.print(
                f"no samples{where} in {session.db_path}; take some with `tracecal samples measure compute|comm` "
                "or import them with `tracecal samples import DIR --cluster NAME`",
                soft_wrap=True,  # one line: a path or a command cut in two cannot be pasted
            )
            return
        by_op = overview.group_by(["cluster", "family", "op", "direction"]).aggregate(
            [("tp_values", "max"), ("topologies", "max"), ("samples", "sum"), ("flagged", "sum")]
        )
        order = ["cluster", "family", "op", "direction", "tp_values_max", "topologies_max"]
        order += ["samples_sum", "flagged_sum"]
        render_rows(
            f"samples in {session.db_path}",
            ["cluster", "family", "op", "dir", "tp", "topology", "samples", "flagged"],
            sorted([r[c] for c in order] for r in by_op.to_pylist()),
        )
        by_source = overview.group_by(["cluster", "source", "devices"]).aggregate(
            [("samples", "sum"), ("flagged", "sum")]
        )
        order = ["cluster", "source", "devices", "samples_sum", "flagged_sum"]
        render_rows(
            "per cluster and source",
            ["cluster", "source", "devices", "samples", "flagged"],
            sorted([r[c] for c in order] for r in by_source.to_pylist()),
        )
        if flags.num_rows:
            render_arrow("flagged samples per reason (excluded from calibration)", flags)


@app.command("flag")
def flag(
    cluster: Annotated[str, typer.Option(help="Cluster whose samples are re-flagged.")],
    db: DbOption = None,
) -> None:
    """Recompute the quality flags of a cluster's samples together (after sampling in parts)."""
    from tracecal.api import Session

    with user_errors():
        counts = Session(db).samples_flag(cluster)
        text = ", ".join(f"{n} {reason}" for reason, n in counts.items()) or "none"
        stdout.print(f"cluster {cluster}: flagged {text}")

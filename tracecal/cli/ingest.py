"""`tracecal ingest` / `trace-ingest`: load run directories of rank traces into the database."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tracecal.cli.common import (
    Col,
    DbOption,
    one_command_app,
    progress_bar,
    render_rows,
    stderr,
    stdout,
    user_errors,
    warn,
)
from tracecal.vocabulary import ParallelLayout

if TYPE_CHECKING:  # imported when the command runs: ``--help`` stays quick
    from tracecal.pipeline.decode import DecodeSummary
    from tracecal.pipeline.ingest import IngestReport, Progress


def ingest(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (one trace per rank), or single trace files.")],
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (default: the directory name).")] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers", "-j", min=1, help="Parser processes, or with --dask local Dask workers (default: CPU cores)."
        ),
    ] = os.cpu_count() or 1,
    on_error: Annotated[
        str, typer.Option("--on-error", help="raise: stop at the first bad file; skip: leave it out and report it.")
    ] = "raise",
    cluster: Annotated[str | None, typer.Option("--cluster", help="Cluster the run was taken on.")] = None,
    pp: Annotated[int | None, typer.Option("--pp", min=1, help="Pipeline-parallel size.")] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="Tensor-parallel size.")] = None,
    dp: Annotated[int | None, typer.Option("--dp", min=1, help="Data-parallel size.")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", min=1, help="Nodes of the job.")] = None,
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node", min=1, help="GPUs per node.")] = None,
    iteration_marker: Annotated[
        str | None,
        typer.Option("--iteration-marker", help="Regex of the iteration marker (default ProfilerStep#N)."),
    ] = None,
    dask: Annotated[
        str | None,
        typer.Option(
            "--dask",
            help="Parse on Dask: 'local' (a LocalCluster of --workers workers) or a scheduler address "
            "(tcp://host:8786), whose workers must see the trace files and --shard-dir at the same paths.",
        ),
    ] = None,
    shard_dir: Annotated[
        Path | None,
        typer.Option(
            "--shard-dir",
            help="Where parsed ranks wait as Parquet shards until loaded (a temporary directory made "
            "there, removed after). Default: beside the database. With a remote --dask, a shared filesystem.",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Find the rank traces of each run, parse them in parallel and store them (one transaction per
    run; re-ingesting a run replaces it). Prints a summary: ranks, events, seconds, MB/s."""
    from tracecal.api import Session

    with user_errors():
        session = Session(db)
        with progress_bar() as bar:
            tasks: dict[str, object] = {}

            def on_progress(update: Progress) -> None:
                task = tasks.get(update.run_id)
                if task is None:
                    task = tasks[update.run_id] = bar.add_task(update.run_id, total=update.files_total)
                bar.update(task, completed=update.files_done)  # type: ignore[arg-type]

            report = session.ingest_report(
                runs, run_id=run_id, workers=workers, on_error=on_error, cluster=cluster,
                layout=ParallelLayout(pp=pp, tp=tp, dp=dp, nodes=nodes, gpus_per_node=gpus_per_node),
                iteration_marker=iteration_marker, dask=dask, shard_dir=shard_dir, progress=on_progress,
            )  # fmt: skip
        _print_report(report, session.db_path)


def _print_report(report: IngestReport, db_path: Path) -> None:
    for skipped in report.skipped:
        warn(f"skipped {skipped.path}: {skipped.reason}")
    for run in report.runs:
        for skipped in run.skipped:
            warn(f"skipped {skipped.path}: {skipped.reason}")
        for note in run.warnings:
            warn(note)
        if run.missing_ranks:
            shown = ", ".join(str(r) for r in run.missing_ranks[:12])
            more = "" if len(run.missing_ranks) <= 12 else f" and {len(run.missing_ranks) - 12} more"
            warn(f"{run.run_id}: {len(run.missing_ranks)} of {run.world_size} ranks have no trace ({shown}{more})")
        if not run.layout.known:
            warn(f"{run.run_id}: parallel layout unknown; pass --pp/--tp/--dp for features that need it")
    if not report.runs:
        stderr.print("nothing ingested")
        raise typer.Exit(1)
    render_rows(
        f"ingested into {db_path} in {report.seconds:.2f} s",
        READ_COLUMNS,
        [
            [
                r.run_id,
                r.format,
                f"{r.ranks}/{r.world_size}",
                f"{r.layout.pp}x{r.layout.tp}x{r.layout.dp}" if r.layout.known else "",
                r.files_read,
                r.source_bytes / 1e6,
                r.events,
                r.kernels,
                r.seconds,
                r.mb_per_s,
            ]
            for r in report.runs
        ],
    )
    for r in report.runs:
        if r.table_rows is not None:
            stdout.print(
                f"{r.run_id}: a decoded run, read from {r.files_read} files ({r.table_rows} table rows, "
                f"{r.source_bytes / 1e6:.1f} MB; format {r.format}) and rebuilt as {r.ranks} rank traces",
                highlight=False,
            )
    decoded = [r for r in report.runs if r.decode is not None]
    if decoded:
        render_rows("decoded", DECODE_COLUMNS, [[r.run_id, *_decode_cells(r.decode)] for r in decoded])


READ_COLUMNS = [
    Col("run", keep=True),
    Col("format", short="fmt"),
    Col("ranks"),
    Col("layout"),
    Col("files", "int"),
    Col("MB", "mb"),
    Col("events", "int"),
    Col("kernels", "int"),
    Col("s", "s"),
    Col("MB/s", "mb"),
]
"""The ingest summary: what each run read and stored (MB: uncompressed trace, or a decoded run's tables)."""

DECODE_COLUMNS = [
    Col("run", keep=True),
    Col("operators", "int", short="ops"),
    Col("kernel time linked %", "share", short="linked %"),
    Col("iterations"),
    Col("best iteration", "int", short="best"),
    Col("best ms", "ms"),
]
"""What decode derived: operators, the share of kernel time linked to an operator, iterations, the best one."""


def _decode_cells(d: DecodeSummary | None) -> list[object]:
    """Decode figures for the summary row: operators, kernel time linked, iterations, best."""
    if d is None:
        return [None] * (len(DECODE_COLUMNS) - 1)
    iters = d.iterations if d.markers_found else f"{d.iterations} (no markers)"
    best_ms = None if d.best_iteration_ns is None else d.best_iteration_ns / 1e6
    return [d.operators, d.linked_kernel_share, iters, d.best_iteration, best_ms]


def main() -> None:
    """Console script ``trace-ingest``: the same command as ``tracecal ingest``."""
    one_command_app(ingest)()

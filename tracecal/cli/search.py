"""`tracecal search RUN --gpus N` and `tracecal predict RUN --layout PPxTPxDP`: a run's model at other
parallel layouts, rebuilt and replayed (see docs/what-if.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tracecal.cli.common import DbOption, render_rows, show_progress, stderr, stdout, user_errors, warn
from tracecal.errors import PredictionError

if TYPE_CHECKING:
    from tracecal.predict.relayout_run import LayoutPrediction

SEARCH_FORMATS = ("table", "csv")


def render_layout(result: LayoutPrediction, cluster: str | None) -> None:
    """`tracecal predict RUN --layout ...`: the rebuilt layout's components, throughput and what no
    model covered (``cluster``: whose models predicted; None for traced durations)."""
    lay = result.layout
    title = f"{result.run_id} at {lay.text} (PPxTPxDP), " + (
        f"cluster {cluster}'s models" if cluster else "traced durations"
    )
    rows = [
        [r["component"], f"{r['ms']:.3f}", f"{100 * r['share']:.1f} %"] for r in result.components.iter_rows(named=True)
    ]
    render_rows(title, ["component", "predicted ms", "share of iteration"], rows)
    stdout.print(
        f"layers per stage {result.relayout.layers_per_stage} ({result.relayout.partition_rule} partition); "
        f"{lay.micro_batches} micro-batches of {lay.micro_batch_size} per data-parallel rank; "
        f"nodes of {lay.gpus_per_node} GPUs",
        highlight=False,
    )
    stdout.print(
        f"iteration (slowest stage): {result.iteration_ns / 1e6:.3f} ms for {result.samples} samples: "
        f"{result.throughput:.2f} samples/s; idle {100 * result.idle_share:.1f} % and exposed pipeline "
        f"transfers and waits (comm_pp, the bubble) {100 * _share(result, 'comm_pp'):.1f} %",
        highlight=False,
    )
    if result.gap_share is not None:
        stdout.print(
            f"CPU-side gaps kept as traced (per kernel position) on the critical path: {100 * result.gap_share:.1f} % "
            "of the iteration",
            highlight=False,
        )
    top = result.uncovered.head(6)
    if cluster is None:
        stdout.print(
            "traced durations: every operator keeps its traced duration times the work ratio of its new shape",
            highlight=False,
        )
    elif top.height:
        total = float(result.uncovered["share"].sum())
        names = ", ".join(
            f"{r['name'][:48]} ({r['family']}) {100 * r['share']:.2f} %" for r in top.iter_rows(named=True)
        )
        warn(
            f"{100 * total:.1f} % of operator time has no model at its new shape (traced duration times the work "
            f"ratio): {names}"
        )


def _share(result: LayoutPrediction, component: str) -> float:
    hit = result.components.filter(result.components["component"] == component)["share"]
    return float(hit[0]) if hit.len() else 0.0


def search(
    run: Annotated[str, typer.Argument(help="Run id (see `tracecal runs`); a decoded GPT-NeoX run.")],
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs every layout uses (PP·TP·DP).")],
    cluster: Annotated[
        str | None, typer.Option("--cluster", help="Cluster whose calibrated models predict durations.")
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", min=1, help="GPUs per node (default: as the run).")
    ] = None,
    micro_batches: Annotated[
        int | None,
        typer.Option("--micro-batches", min=1, help="Micro-batches per data-parallel rank (default: as the run)."),
    ] = None,
    micro_batch_size: Annotated[
        int | None, typer.Option("--micro-batch-size", min=1, help="Samples per micro-batch (default: as the run).")
    ] = None,
    gpu_memory_gib: Annotated[
        float | None,
        typer.Option(
            "--gpu-memory-gib", min=1, help="Device memory per GPU (default: from the cluster's device name)."
        ),
    ] = None,
    mode: Annotated[
        str, typer.Option("--mode", help="predicted (needs --cluster) or measured (traced durations).")
    ] = "predicted",
    fmt: Annotated[str, typer.Option("--format", help="table or csv.")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the CSV to this file.")] = None,
    figure: Annotated[
        Path | None, typer.Option("--figure", help="PNG of throughput and component split per layout.")
    ] = None,
    db: DbOption = None,
) -> None:
    """List the valid parallel layouts of N GPUs for RUN's model (heads and hidden size divisible by TP,
    layers over PP, whole nodes, memory per GPU), predict each by rebuilding and replaying its iteration,
    and rank them by throughput: samples per second at the global batch each layout runs (DP ·
    micro-batches · micro-batch size, stated). Shows each layout's iteration time, component split and
    idle share (the pipeline bubble shows as exposed comm_pp and idle)."""
    from tracecal.api import Session

    with user_errors():
        if fmt not in SEARCH_FORMATS:
            raise PredictionError(f"unknown --format {fmt!r}; use one of {', '.join(SEARCH_FORMATS)}")

        def progress(layout, i, n) -> None:
            if show_progress():
                stderr.print(f"predicting {layout.text} ({i + 1} of {n})", highlight=False)

        result, memory_source = Session(db).search_report(
            run, gpus=gpus, cluster=cluster, mode=mode, gpus_per_node=gpus_per_node, micro_batches=micro_batches,
            micro_batch_size=micro_batch_size, gpu_memory_gib=gpu_memory_gib, progress=progress,
        )  # fmt: skip
        table = result.table
        if fmt == "csv":
            text = table.write_csv(float_precision=4)
            if output is not None:
                output.write_text(text)
                stdout.print(f"wrote {table.height} layouts to {output}")
            else:
                typer.echo(text, nl=False)
        else:
            _render_search(run, result, memory_source)
        if figure is not None:
            from tracecal.predict.figures_search import search_figure

            stdout.print(f"figure: {search_figure(table, figure, f'{run}: layouts of {gpus} GPUs')}")


def _render_search(run: str, result, memory_source: str) -> None:
    table = result.table
    comp_cols = [
        c for c in table.columns if c.endswith("_share") and c not in ("idle_share", "gap_share", "uncovered_share")
    ]
    rows = []
    for r in table.iter_rows(named=True):
        split = ", ".join(
            f"{c.removesuffix('_share').removeprefix('compute_')} {100 * r[c]:.0f}%"
            for c in comp_cols
            if r.get(c) and r[c] >= 0.02 and c != "idle_share"
        )
        rows.append([
            r["rank"], r["layout"], r["global_batch"], f"{r['iteration_ms']:.1f}", f"{r['samples_per_s']:.2f}",
            f"{100 * r['idle_share']:.1f} %", split,
        ])  # fmt: skip
    render_rows(
        f"{run}: layouts of {result.gpus} GPUs ranked by throughput (PPxTPxDP)",
        ["rank", "layout", "global batch", "iteration ms", "samples/s", "idle", "split (≥ 2 %)"],
        rows,
    )
    stdout.print(
        "shares are of the slowest stage's iteration; the pipeline bubble shows as comm_pp (a receive spans "
        f"the wait for its sender) and idle; memory per GPU: {memory_source}",
        highlight=False,
    )
    for r in result.rejected:
        stdout.print(f"left out: {r.reason}", highlight=False)

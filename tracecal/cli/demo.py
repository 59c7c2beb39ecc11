"""`tracecal demo`: the whole loop on a real multi-process training run generated on this machine.

The stages are `tracecal.api.Session.demo`'s (``tracecal/api/demo.py``): train the reference workload
→ ingest and decode → sample the traced shapes → calibrate a ``local`` cluster → replay the best
iteration measured and predicted. This module parses the options and prints each stage's result as
it arrives; everything lands in one directory (a temporary one unless ``--dir`` is given), with its
own database. ``--device cuda`` runs the same loop on GPUs; ``benchmarks/gpu_check.sh`` runs it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tracecal.cli.common import progress_bar, render_rows, stdout, user_errors, warn

PROGRESS_STAGES = ("sample", "calibrate")
"""The stages that report progress (a bar on a terminal, lines elsewhere)."""

if TYPE_CHECKING:
    from tracecal.api.demo import Calibrated, DemoReport, DemoStage, Headline, Ingested, Predicted, Sampled, Trained


def demo(
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Work directory (default: a new temporary directory).")
    ] = None,
    device: Annotated[
        str,
        typer.Option(
            "--device",
            help="cpu (local gloo ranks) or cuda (one rank per GPU, a GPT sized to the GPU's memory, samples timed "
            "by their kernels).",
        ),
    ] = "cpu",
    pp: Annotated[
        int | None, typer.Option(help="Pipeline stages of the reference workload (default: 2 on cpu, 1 on cuda).")
    ] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel ranks per stage.")] = 1,
    dp: Annotated[int, typer.Option(help="Data-parallel replicas.")] = 1,
    steps: Annotated[int, typer.Option(help="Training steps (the profiler records the last steps-2).")] = 10,
    repeats: Annotated[int, typer.Option(help="Timed repeats per sampled shape in each pass.")] = 2,
    passes: Annotated[
        int, typer.Option(help="Sampling passes over all shapes (a shape's repeats spread over the run).", min=1)
    ] = 3,
    processes: Annotated[
        int | None,
        typer.Option(
            help="Concurrent sampler processes (default: the workload's ranks, which share this machine's cores).",
            min=1,
        ),
    ] = None,
    timing: Annotated[
        str | None,
        typer.Option(
            "--timing",
            help="How samples are timed: cpu perf_counter (default) or profiler; cuda cuda_burst (default), "
            "profiler (kernel durations) or cuda_events (docs/samples.md#timing).",
        ),
    ] = None,
) -> None:
    """Run the whole loop on this machine: train the reference GPT (PP2 by default) with local gloo
    ranks under torch.profiler, ingest the traces, sample the traced shapes on this CPU, calibrate a
    'local' cluster, replay the best iteration (measured and predicted), and print the error tables
    and where the figures are. Minutes on 2 cores (measured: benchmarks/RESULTS.md). --device cuda runs it
    on GPUs, with a model that keeps them busy."""
    with user_errors():
        from tracecal.api import Session
        from tracecal.api.demo import STAGES, plan_demo

        plan = plan_demo(device, pp, tp, dp, steps, timing)
        if plan.sizing is not None:
            stdout.print(plan.sizing, highlight=False)
        work = directory or Path(tempfile.mkdtemp(prefix="tracecal-demo-"))
        stdout.print(f"tracecal demo in {work} on {device}")

        bars = ExitStack()  # a progress bar while a stage that reports progress runs
        tasks: dict[str, Any] = {}

        def on_start(stage: DemoStage) -> None:
            stdout.print(f"[bold][{stage.index}/{len(STAGES)}] {stage.name}[/]: {stage.what}", highlight=False)
            if stage.name in PROGRESS_STAGES:
                bar: Any = bars.enter_context(progress_bar())
                tasks[stage.name] = (bar, bar.add_task(stage.name, total=None))

        def progress(stage: str, done: int, total: int, label: str) -> None:
            bar, task = tasks[stage]
            bar.update(task, completed=done, total=total, description=label)

        def on_done(stage: DemoStage, result: Any) -> None:
            bars.close()
            # wall and CPU side by side: on a shared machine the wall time says more about the neighbours
            stdout.print(f"      done in {stage.seconds:.1f} s ({stage.cpu_seconds:.1f} s CPU)", highlight=False)
            RENDER[stage.name](result)

        with bars:
            report = Session(work / "demo.duckdb").demo(
                work, plan, repeats=repeats, passes=passes, processes=processes, on_start=on_start,
                on_done=on_done, progress=progress,
            )  # fmt: skip
        _print_total(report)


def _print_total(report: DemoReport) -> None:
    wall = {s.name: s.seconds or 0.0 for s in report.stages}
    cpu = sum(s.cpu_seconds or 0.0 for s in report.stages)
    stdout.print(
        f"total {sum(wall.values()):.0f} s wall, {cpu:.0f} s CPU ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in wall.items())
        + f"); database {report.db}, figures in {report.figures}"
    )
    run_id = report.plan.run_id
    db = report.db
    stdout.print(f"explore: tracecal predict {run_id} --db {db} --mode measured;  tracecal sql --db {db} ...")


def _trained(t: Trained) -> None:
    stdout.print(f"      {t.run_dir}: {t.world_size} rank traces, profiled steps {t.profiled_steps}")


def _ingested(r: Ingested) -> None:
    from tracecal.sql.gpu_busy import GPU_BOUND_SHARE

    stdout.print(
        f"      {r.ranks} ranks, {r.events} events, {r.operators} operators; best iteration {r.best_iteration} "
        f"({r.best_ms:.1f} ms on its slowest rank)"
    )
    if r.busy:
        shares = ", ".join(f"rank {rank} {100 * share:.1f} %" for rank, share in r.busy.items())
        stdout.print(
            f"      GPU busy in the best iteration: {shares} (GPU-bound at ≥ {100 * GPU_BOUND_SHARE:.0f} %)",
            highlight=False,
        )


def _sampled(r: Sampled) -> None:
    stdout.print(
        f"      {r.traced_points} traced shapes + neighbours = {r.points} points: {r.written} samples "
        f"written, {r.skipped} skipped; {r.unmapped_calls} distinct traced calls have no sampler and keep "
        "their measured time"
    )


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f}"


def _calibrated(r: Calibrated) -> None:
    from tracecal.api.demo import CLUSTER

    if r.calibration is None:
        warn(f"no calibrated models, predicted mode skipped: {r.skipped}")
        return
    rows = [
        [row["op"], row["direction"], row["model"], row["n_train"], _pct(row["mape"]), row["status"]]
        for row in r.calibration.report.iter_rows(named=True)
    ]
    render_rows(
        f"cluster {CLUSTER}: {r.calibration.stored} models stored",
        ["op", "direction", "model", "n train", "hold-out MAPE %", "status"],
        rows,
    )


def headline_lines(h: Headline) -> list[str]:
    """The demo's score in words, headline first (the API's ``Headline.score`` says which)."""
    from tracecal.sql.gpu_busy import GPU_BOUND_SHARE

    iteration = f"overall iteration error (slowest rank {h.rank}, {h.replay} replay): {h.iteration_error_pct:+.2f} %"
    if h.score == "iteration":
        return [iteration]
    parts = ", ".join(f"{c} {e:+.2f} %" for c, e in h.components.items() if e is not None) or "none predicted"
    return [
        f"compute components (slowest rank {h.rank}, {h.replay} replay): {parts}",
        f"the GPU was busy {100 * (h.busy_share or 0.0):.1f} % of the iteration (< {100 * GPU_BOUND_SHARE:.0f} %): "
        f"its time is the host launching kernels, not a test of the models; {iteration}",
    ]


def _predicted(r: Predicted) -> None:
    import polars as pl

    from tracecal.predict.validate import to_markdown

    stdout.print(f"      measured-mode replay reproduces every rank within {r.fidelity_pct:.3f} % (fidelity check)")
    if r.dependency_error_pct is not None and r.unexplained_pct is not None:
        stdout.print(
            f"      dependency replay (no absorbed slack) within {r.dependency_error_pct:.3f} % on every rank; "
            f"unexplained slack at most {r.unexplained_pct:.3f} % of an iteration"
        )
    shown = r.shown
    rows = [
        [
            c["rank"],
            c["component"],
            f"{c['measured_ns'] / 1e6:.2f}",
            f"{c['predicted_ns'] / 1e6:.2f}",
            "" if c["error_pct"] is None else f"{c['error_pct']:+.2f}",
            "" if c["covered_share"] is None else f"{100 * c['covered_share']:.0f} %",
        ]
        for c in shown.components.filter((pl.col("measured_ns") > 0) | (pl.col("predicted_ns") > 0)).iter_rows(
            named=True
        )
    ]
    render_rows(
        f"{r.run_id}: {shown.mode} vs measured, per rank and component",
        ["rank", "component", "measured ms", "predicted ms", "error %", "model-covered"],
        rows,
    )
    stdout.print(to_markdown(r.error_table, f"component error % across ranks ({shown.mode})"))
    if r.headline is not None:
        _print_headline(r.headline)
    stdout.print(f"figures: {', '.join(map(str, r.figures))}")


def _print_headline(h: Headline) -> None:
    first, *rest = headline_lines(h)
    stdout.print(f"[bold]{first}[/]", highlight=False)
    for text in rest:
        stdout.print(text, highlight=False)
    also = "" if h.fitted_error_pct is None else f"; fitted replay {h.fitted_error_pct:+.2f} %"
    stdout.print(
        f"iteration: measured {h.measured_ms:.1f} ms, predicted {h.predicted_ms:.1f} ms{also}; "
        f"{100 * h.model_share:.0f} % of operator time predicted by a model",
        highlight=False,
    )


RENDER: dict[str, Callable[[Any], None]] = {
    "workload": _trained,
    "ingest": _ingested,
    "sample": _sampled,
    "calibrate": _calibrated,
    "predict": _predicted,
}
"""How each stage's result is printed."""

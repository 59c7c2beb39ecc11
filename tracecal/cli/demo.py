"""`tracecal demo`: the whole loop on a real multi-process training run generated on this machine.

Stages: train the reference workload (PP2 by default, gloo ranks on CPU, torch.profiler traces) →
ingest and decode → sample the traced operator shapes on this CPU (``--from-run``) → calibrate a
``local`` cluster → replay the best iteration with measured durations (fidelity) and with the
calibrated models (prediction, dependency replay) → print the error tables and write the figures.
Everything lands in one directory (a temporary one unless ``--dir`` is given), with its own database.

``--device cuda`` runs the same loop on GPUs (one rank by default): a GPT sized to the device's
memory so the GPU, not the CPU launching its kernels, sets the iteration time
(``workload.sizing``), samples timed by their kernels (``samplers.timing``), and the GPU-busy share
of the best iteration printed (``sql.gpu_busy``). The iteration error is the headline only when the
GPU was busy (``GPU_BOUND_SHARE``); otherwise the compute components are. ``benchmarks/gpu_check.sh``
runs it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from tracecal.cli.common import progress_bar, render_rows, stdout, user_errors, warn
from tracecal.config import model_store_dir
from tracecal.errors import CalibrationError, SampleError, WorkloadError

CLUSTER = "local"
STAGES = ("workload", "ingest", "sample", "calibrate", "predict")
DEVICES = ("cpu", "cuda")
PREDICT_REPLAY = "dependency"
"""The replay the demo's prediction is scored with: only dependencies and nominal lags, so the
error is the models' and the graph's, with no measured slack kept as fixed lags."""
COMPUTE_COMPONENTS = ("compute_fwd", "compute_bwd", "optimizer")
"""The headline of a CPU-bound GPU run: the components made of kernels the models predict."""


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (the workload's ranks)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@contextmanager
def _stage(index: int, name: str, what: str, timings: dict[str, float]) -> Iterator[None]:
    stdout.print(f"[bold][{index}/{len(STAGES)}] {name}[/]: {what}", highlight=False)
    started, cpu = time.perf_counter(), _cpu_seconds()
    yield
    timings[name] = time.perf_counter() - started
    timings[f"{name}_cpu"] = _cpu_seconds() - cpu
    # wall and CPU side by side: on a shared machine the wall time says more about the neighbours
    stdout.print(f"      done in {timings[name]:.1f} s ({timings[f'{name}_cpu']:.1f} s CPU)", highlight=False)


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
        from dataclasses import replace

        from tracecal.samplers.plan import run_settings
        from tracecal.samplers.timing import check_timing, default_timing

        pp = resolve_layout(device, pp, tp, dp, _cuda_devices() if device == "cuda" else 0)
        method = check_timing(timing or default_timing(device), device)
        cfg = workload_config(device, pp, tp, dp, steps)
        work = directory or Path(tempfile.mkdtemp(prefix="tracecal-demo-"))
        work.mkdir(parents=True, exist_ok=True)
        db = work / "demo.duckdb"
        figures = work / "figures"
        timings: dict[str, float] = {}
        run_dir = work / f"{cfg.model}_pp{pp}_tp{tp}_dp{dp}"
        stdout.print(f"tracecal demo in {work} on {device}")
        run_id = _train(run_dir, cfg, timings)
        busy = _ingest(db, run_dir, run_id, timings)
        settings = run_settings(CLUSTER, device, run_id, repeats, passes, processes or pp * tp * dp)
        _sample(db, run_id, replace(settings, timing=method), timings)
        model = _calibrate(db, timings)
        _predict(db, run_id, model, figures, timings, busy)
        wall = {k: v for k, v in timings.items() if not k.endswith("_cpu")}
        cpu = sum(v for k, v in timings.items() if k.endswith("_cpu"))
        stdout.print(
            f"total {sum(wall.values()):.0f} s wall, {cpu:.0f} s CPU ("
            + ", ".join(f"{k} {v:.0f} s" for k, v in wall.items())
            + f"); database {db}, figures in {figures}"
        )
        stdout.print(f"explore: tracecal predict {run_id} --db {db} --mode measured;  tracecal sql --db {db} ...")


def resolve_layout(device: str, pp: int | None, tp: int, dp: int, gpus: int) -> int:
    """The pipeline stages to run (2 on CPU, 1 on a GPU unless given), after checking the device.

    Raises:
        WorkloadError: an unknown device, ``cuda`` without a CUDA device, or more ranks than GPUs.
    """
    if device not in DEVICES:
        raise WorkloadError(f"--device {device!r}: use one of {', '.join(DEVICES)}")
    pp = pp if pp is not None else (1 if device == "cuda" else 2)
    if device == "cuda":
        if gpus < 1:
            raise WorkloadError(
                "no CUDA device: torch sees none (torch.cuda.is_available() is False); run the demo without "
                "--device cuda, or on a machine with a GPU and a CUDA build of torch"
            )
        if pp * tp * dp > gpus:
            raise WorkloadError(
                f"--device cuda runs one rank per GPU: pp*tp*dp = {pp * tp * dp} ranks but {gpus} GPU(s) visible"
            )
    return pp


def _cuda_devices() -> int:
    """CUDA devices torch can use (0 without a GPU or with a CPU-only build of torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def workload_config(device: str, pp: int, tp: int, dp: int, steps: int) -> Any:
    """The reference workload to train: the tiny GPT on CPU; on CUDA the one ``workload.sizing``
    picks for the first GPU's memory (printed with the reason)."""
    from tracecal.workload import WorkloadConfig
    from tracecal.workload.sizing import gpu_demo_config, training_bytes

    if device == "cpu":
        return WorkloadConfig(pp=pp, tp=tp, dp=dp, steps=steps, device=device).validate()
    import torch

    props = torch.cuda.get_device_properties(0)
    cfg = gpu_demo_config(props.total_memory, pp, tp, dp, steps)
    stdout.print(
        f"{props.name}, {props.total_memory / 2**30:.1f} GiB: {cfg.model} (hidden {cfg.hidden}, {cfg.layers} layers, "
        f"seq {cfg.seq}, {cfg.dtype}), about {training_bytes(cfg) / 2**30:.1f} GiB to train",
        highlight=False,
    )
    return cfg


def _train(run_dir: Path, cfg: Any, timings: dict[str, float]) -> str:
    from tracecal.workload import run_local

    where = "local gloo ranks" if cfg.device == "cpu" else "CUDA rank(s)"
    what = f"train the reference GPT on {cfg.world_size} {where} (pp={cfg.pp} tp={cfg.tp} dp={cfg.dp}), profiled"
    with _stage(1, "workload", what, timings):
        result = run_local(cfg, run_dir, force=True)
    profiled = result.run["profile"]["profiled_steps"]
    stdout.print(f"      {run_dir}: {cfg.world_size} rank traces, profiled steps {profiled}")
    return run_dir.name


def _ingest(db: Path, run_dir: Path, run_id: str, timings: dict[str, float]) -> dict[int, float]:
    """Ingest the run; return each rank's GPU-busy share of the best iteration (empty on CPU)."""
    from tracecal.pipeline.ingest import IngestOptions, ingest_runs
    from tracecal.sql.connection import open_database
    from tracecal.sql.gpu_busy import GPU_BOUND_SHARE, gpu_busy

    with _stage(2, "ingest", f"parse and decode {run_dir.name} into {db.name}", timings), open_database(db) as con:
        report = ingest_runs(con, [run_dir], IngestOptions(cluster=CLUSTER, workers=2))
        best = con.execute("SELECT iteration, dur_ns FROM best_iteration WHERE run_id = ?", [run_id]).fetchall()
        ops = con.execute("SELECT count(*) FROM operators WHERE run_id = ?", [run_id]).fetchall()[0][0]
        busy = gpu_busy(con, run_id)
    r = report.runs[0]
    stdout.print(
        f"      {r.ranks} ranks, {r.events} events, {ops} operators; best iteration {best[0][0]} "
        f"({best[0][1] / 1e6:.1f} ms on its slowest rank)"
    )
    if busy:
        shares = ", ".join(f"rank {b.rank} {100 * b.busy_share:.1f} %" for b in busy)
        stdout.print(
            f"      GPU busy in the best iteration: {shares} (GPU-bound at ≥ {100 * GPU_BOUND_SHARE:.0f} %)",
            highlight=False,
        )
    return {b.rank: b.busy_share for b in busy}


def _sample(db: Path, run_id: str, settings: Any, timings: dict[str, float]) -> None:
    from tracecal.samplers.compute import sample_compute
    from tracecal.samplers.from_run import run_points
    from tracecal.samplers.plan import neighbourhood
    from tracecal.sql.connection import open_database

    if settings.device == "cpu":
        what = (
            f"time the traced operator shapes and their neighbours on this CPU, {settings.processes} processes at once"
        )
    else:
        what = f"time the traced operator shapes and their neighbours on {settings.device} ({settings.timing})"
    with _stage(3, "sample", what, timings):
        with open_database(db) as con:
            plan = run_points(con, run_id, None)
            points = neighbourhood(plan.points)
            with progress_bar() as bar:
                task = bar.add_task("sampling", total=None)

                def progress(done: int, total: int, label: str) -> None:
                    bar.update(task, completed=done, total=total, description=label)

                report = sample_compute(con, points, settings, progress=progress, extra_params=plan.params_for)
        unmapped = sum(plan.unmapped.values())
        stdout.print(
            f"      {len(plan.points)} traced shapes + neighbours = {len(points)} points: {report.written} samples "
            f"written, {len(report.skipped)} skipped; {unmapped} distinct traced calls have no sampler and keep "
            "their measured time"
        )


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f}"


def _calibrate(db: Path, timings: dict[str, float]) -> Any:
    """Fit, validate and store the local cluster's models; return them loaded for the replay."""
    from tracecal.calibrate import calibrate_cluster
    from tracecal.predict.models import load_duration_model
    from tracecal.sql.connection import open_database

    what = f"fit and validate regressors for cluster {CLUSTER!r} (k-fold selection, hold-out errors)"
    with _stage(4, "calibrate", what, timings), open_database(db) as con:
        with progress_bar() as bar:
            task = bar.add_task("calibrating", total=None)

            def progress(key: Any, index: int, total: int) -> None:
                bar.update(task, completed=index, total=total, description=f"{key.op} {key.direction}")

            # 2-fold model selection keeps the demo within minutes; `calibrate` defaults to 3 folds
            try:
                result = calibrate_cluster(con, CLUSTER, store_dir=model_store_dir(db), folds=2, on_group=progress)
            except (CalibrationError, SampleError) as exc:
                # the loop still shows the measured replay; say why there is no prediction
                warn(f"no calibrated models, predicted mode skipped: {exc}")
                return None
        model = load_duration_model(con, model_store_dir(db), CLUSTER)
    report = result.report
    rows = [
        [
            r["op"],
            r["direction"],
            r["model"],
            r["n_train"],
            _pct(r["mape"]),
            r["status"],
        ]
        for r in report.iter_rows(named=True)
    ]
    render_rows(
        f"cluster {CLUSTER}: {result.stored} models stored",
        ["op", "direction", "model", "n train", "hold-out MAPE %", "status"],
        rows,
    )
    return model


def _print_slack(measured: Any) -> None:
    """The dependency replay's error with measured durations and the unexplained share, worst rank."""
    import polars as pl

    from tracecal.predict.run import slack_report

    it = slack_report(measured).filter(pl.col("component") == "iteration")
    dep, share = it["dependency_error_pct"].abs().max(), it["unexplained_pct"].max()
    if not isinstance(dep, float) or not isinstance(share, float):
        return
    stdout.print(
        f"      dependency replay (no absorbed slack) within {dep:.3f} % on every rank; unexplained slack at most "
        f"{share:.3f} % of an iteration"
    )


def headline_lines(
    busy_share: float | None, rank: int, replay: str, iteration_error_pct: float, components: dict[str, float | None]
) -> list[str]:
    """The demo's score, headline first. The iteration error is the headline when the rank's GPU was
    busy (``is_gpu_bound``) or the run has no GPU (``busy_share`` None: a CPU trace's operators are
    the compute). Otherwise the iteration time is the host launching kernels, and the headline is the
    errors of the compute ``components`` (component -> error %, None when not predicted)."""
    from tracecal.sql.gpu_busy import GPU_BOUND_SHARE, is_gpu_bound

    iteration = f"overall iteration error (slowest rank {rank}, {replay} replay): {iteration_error_pct:+.2f} %"
    if busy_share is None or is_gpu_bound(busy_share):
        return [iteration]
    parts = ", ".join(f"{c} {e:+.2f} %" for c, e in components.items() if e is not None) or "none predicted"
    return [
        f"compute components (slowest rank {rank}, {replay} replay): {parts}",
        f"the GPU was busy {100 * busy_share:.1f} % of the iteration (< {100 * GPU_BOUND_SHARE:.0f} %): its time is "
        f"the host launching kernels, not a test of the models; {iteration}",
    ]


def _predict(
    db: Path, run_id: str, model: Any, figures: Path, timings: dict[str, float], busy: dict[int, float]
) -> None:
    import polars as pl

    from tracecal.predict.figures import component_proportions, rank_timeline
    from tracecal.predict.store import predict_stored_run
    from tracecal.predict.validate import error_table, to_markdown
    from tracecal.sql.connection import open_database

    what = "replay the best iteration: measured (fidelity) and predicted (dependency replay)"
    with _stage(5, "predict", what, timings):
        with open_database(db) as con:
            _, measured = predict_stored_run(con, run_id, mode="measured")
            predicted = None
            if model is not None:
                _, predicted = predict_stored_run(
                    con, run_id, mode="predicted", cluster=CLUSTER, model=model, replay=PREDICT_REPLAY
                )
        fidelity = measured.iteration_error()
        worst = float(fidelity["error_pct"].abs().max())  # type: ignore[arg-type]
        stdout.print(f"      measured-mode replay reproduces every rank within {worst:.3f} % (fidelity check)")
        _print_slack(measured)
        shown = predicted or measured
        comps = shown.components.with_columns(pl.lit(run_id).alias("run_id"))
        bars = component_proportions(comps, figures / "component_proportions.png")
        slow = int(shown.iteration_error().sort("measured_ns", descending=True)["rank"][0])
        line = rank_timeline(shown, slow, figures / f"timeline_rank{slow}.png", f"{run_id} rank {slow} ({shown.mode})")
    rows = [
        [
            r["rank"],
            r["component"],
            f"{r['measured_ns'] / 1e6:.2f}",
            f"{r['predicted_ns'] / 1e6:.2f}",
            "" if r["error_pct"] is None else f"{r['error_pct']:+.2f}",
            "" if r["covered_share"] is None else f"{100 * r['covered_share']:.0f} %",
        ]
        for r in shown.components.filter((pl.col("measured_ns") > 0) | (pl.col("predicted_ns") > 0)).iter_rows(
            named=True
        )
    ]
    render_rows(
        f"{run_id}: {shown.mode} vs measured, per rank and component",
        ["rank", "component", "measured ms", "predicted ms", "error %", "model-covered"],
        rows,
    )
    stdout.print(to_markdown(error_table(comps), f"component error % across ranks ({shown.mode})"))
    if predicted is not None:
        it = predicted.iteration_error().sort("measured_ns", descending=True).row(0, named=True)
        fitted = predicted.by_replay("fitted")
        also = ""
        if fitted is not None:
            f_it = fitted.iteration_error().filter(pl.col("rank") == it["rank"]).row(0, named=True)
            also = f"; fitted replay {f_it['error_pct']:+.2f} %"
        rank_comps = predicted.components.filter(pl.col("rank") == it["rank"])
        errors = dict(zip(rank_comps["component"].to_list(), rank_comps["error_pct"].to_list(), strict=True))
        first, *rest = headline_lines(
            busy.get(it["rank"]),
            it["rank"],
            predicted.replay,
            it["error_pct"],
            {c: errors.get(c) for c in COMPUTE_COMPONENTS if c in errors},
        )
        stdout.print(f"[bold]{first}[/]", highlight=False)
        for text in rest:
            stdout.print(text, highlight=False)
        stdout.print(
            f"iteration: measured {it['measured_ns'] / 1e6:.1f} ms, predicted {it['predicted_ns'] / 1e6:.1f} ms{also}; "
            f"{100 * predicted.coverage['all']:.0f} % of operator time predicted by a model",
            highlight=False,
        )
    stdout.print(f"figures: {bars}, {line}")

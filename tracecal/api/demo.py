"""The steps of `tracecal demo`: the whole loop on a real multi-process training run generated here.

Stages: train the reference workload (PP2 by default, gloo ranks on CPU, torch.profiler traces) →
ingest and decode → sample the traced operator shapes on this machine (``--from-run`` points and
their neighbours) → calibrate a ``local`` cluster → replay the best iteration with measured
durations (fidelity) and with the calibrated models (prediction, dependency replay), store both and
draw the figures. `Session.demo` runs them into the session's database; the CLI renders each
stage's result as it arrives.

``device="cuda"`` runs the same loop on GPUs (one rank by default): a GPT sized to the device's
memory so the GPU, not the CPU launching its kernels, sets the iteration time (``workload.sizing``),
samples timed by their kernels (``samplers.timing``), and the GPU-busy share of the best iteration
(``sql.gpu_busy``) deciding which score is the headline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tracecal.errors import CalibrationError, SampleError, WorkloadError

if TYPE_CHECKING:
    import polars as pl

    from tracecal.api.session import Calibration, Session
    from tracecal.predict.run import Prediction
    from tracecal.workload import WorkloadConfig

CLUSTER = "local"
"""The cluster the demo's samples, models and run belong to."""
STAGES = ("workload", "ingest", "sample", "calibrate", "predict")
DEVICES = ("cpu", "cuda")
PREDICT_REPLAY = "dependency"
"""The replay the demo's prediction is scored with: only dependencies and nominal lags, so the
error is the models' and the graph's, with no measured slack kept as fixed lags."""
COMPUTE_COMPONENTS = ("compute_fwd", "compute_bwd", "optimizer")
"""The headline of a CPU-bound GPU run: the components made of kernels the models predict."""
FOLDS = 2
"""k of the demo's model selection: 2 folds keep it within minutes (`calibrate` defaults to 3)."""


@dataclass(frozen=True)
class DemoPlan:
    """What the demo will run, checked before anything is created: the device, the layout, the
    timing method of the samples and the workload to train. ``sizing``: on CUDA, why this model
    (the device and the memory it needs); None on CPU."""

    device: str
    pp: int
    tp: int
    dp: int
    timing: str
    workload: WorkloadConfig
    sizing: str | None

    @property
    def run_id(self) -> str:
        return f"{self.workload.model}_pp{self.pp}_tp{self.tp}_dp{self.dp}"


@dataclass(frozen=True)
class DemoStage:
    """One stage: its number (of ``len(STAGES)``), name and what it does; once done, its wall and
    CPU seconds (this process and its finished children, the workload's ranks)."""

    index: int
    name: str
    what: str
    seconds: float | None = None
    cpu_seconds: float | None = None


@dataclass(frozen=True)
class Trained:
    run_dir: Path
    run_id: str
    world_size: int
    profiled_steps: list[int]


@dataclass(frozen=True)
class Ingested:
    """The run as stored: ranks, events, operators, its best iteration, and each rank's GPU-busy
    share of it (empty on CPU)."""

    ranks: int
    events: int
    operators: int
    best_iteration: int
    best_ms: float
    busy: dict[int, float]


@dataclass(frozen=True)
class Sampled:
    traced_points: int
    points: int
    written: int
    skipped: int
    unmapped_calls: int
    """Distinct traced calls no sampler re-runs: they keep their measured time."""


@dataclass(frozen=True)
class Calibrated:
    """The calibration, or None with the reason (the loop still shows the measured replay)."""

    calibration: Calibration | None
    skipped: str | None


HeadlineScore = Literal["iteration", "components"]
"""Which score heads the demo's result (``headline_score``)."""


def headline_score(busy_share: float | None) -> HeadlineScore:
    """The iteration error heads the result when the rank's GPU was busy (``sql.gpu_busy.is_gpu_bound``)
    or the run has no GPU (``busy_share`` None: a CPU trace's operators are the compute). Otherwise the
    iteration time is the host launching kernels, not a test of the models, and the errors of
    ``COMPUTE_COMPONENTS`` head it."""
    from tracecal.sql.gpu_busy import is_gpu_bound

    return "iteration" if busy_share is None or is_gpu_bound(busy_share) else "components"


@dataclass(frozen=True)
class Headline:
    """The demo's score on the slowest rank: ``score`` says which heads it (``headline_score``), the
    iteration error or the errors of ``COMPUTE_COMPONENTS`` (``components``, None where not predicted)."""

    score: HeadlineScore
    rank: int
    replay: str
    iteration_error_pct: float
    measured_ms: float
    predicted_ms: float
    fitted_error_pct: float | None
    model_share: float
    busy_share: float | None
    components: dict[str, float | None]


@dataclass(frozen=True)
class Predicted:
    """Both replays of the best iteration (stored), the figures drawn, and the scores: the measured
    replay's worst rank error (fidelity), the dependency replay's error and unexplained share with
    measured durations (None when not computed), and the headline of the prediction (None without
    models). ``shown``: the prediction the tables show (predicted, else measured)."""

    run_id: str
    measured: Prediction
    predicted: Prediction | None
    figures: list[Path]
    fidelity_pct: float
    dependency_error_pct: float | None
    unexplained_pct: float | None
    error_table: pl.DataFrame
    headline: Headline | None

    @property
    def shown(self) -> Prediction:
        return self.predicted or self.measured


@dataclass
class DemoReport:
    """Everything the demo did, in order, with each stage's wall and CPU seconds."""

    plan: DemoPlan
    directory: Path
    db: Path
    figures: Path
    trained: Trained | None = None
    ingested: Ingested | None = None
    sampled: Sampled | None = None
    calibrated: Calibrated | None = None
    predicted: Predicted | None = None
    stages: list[DemoStage] = field(default_factory=list)


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


def cuda_devices() -> int:
    """CUDA devices torch can use (0 without a GPU or with a CPU-only build of torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_demo(
    device: str = "cpu", pp: int | None = None, tp: int = 1, dp: int = 1, steps: int = 10, timing: str | None = None
) -> DemoPlan:
    """Check the options and choose the workload: the tiny GPT on CPU; on CUDA the one
    ``workload.sizing`` picks for the first GPU's memory.

    Raises:
        WorkloadError: see ``resolve_layout``; a layout the workload cannot run.
        SampleError: a timing method the device does not have.
    """
    from tracecal.samplers.timing import check_timing, default_timing
    from tracecal.workload import WorkloadConfig

    pp = resolve_layout(device, pp, tp, dp, cuda_devices() if device == "cuda" else 0)
    method = check_timing(timing or default_timing(device), device)
    if device == "cpu":
        cfg = WorkloadConfig(pp=pp, tp=tp, dp=dp, steps=steps, device=device).validate()
        return DemoPlan(device, pp, tp, dp, method, cfg, None)
    import torch

    from tracecal.workload.sizing import gpu_demo_config, training_bytes

    props = torch.cuda.get_device_properties(0)
    cfg = gpu_demo_config(props.total_memory, pp, tp, dp, steps)
    sizing = (
        f"{props.name}, {props.total_memory / 2**30:.1f} GiB: {cfg.model} (hidden {cfg.hidden}, {cfg.layers} layers, "
        f"seq {cfg.seq}, {cfg.dtype}), about {training_bytes(cfg) / 2**30:.1f} GiB to train"
    )
    return DemoPlan(device, pp, tp, dp, method, cfg, sizing)


Progress = Callable[[str, int, int, str], None]
"""``progress(stage, done, total, label)`` inside the sample and calibrate stages."""


def run_demo(
    session: Session,
    directory: Path,
    plan: DemoPlan,
    *,
    repeats: int = 2,
    passes: int = 3,
    processes: int | None = None,
    on_start: Callable[[DemoStage], None] | None = None,
    on_done: Callable[[DemoStage, Any], None] | None = None,
    progress: Progress | None = None,
) -> DemoReport:
    """Run the five stages into ``session``'s database, the run and the figures into ``directory``.
    ``on_start(stage)`` before each stage, ``on_done(stage, result)`` after it (with its seconds)."""
    from tracecal.samplers.plan import run_settings

    directory.mkdir(parents=True, exist_ok=True)
    report = DemoReport(plan, directory, session.db_path, directory / "figures")

    def stage(name: str, what: str, step: Callable[[], Any]) -> Any:
        started = DemoStage(STAGES.index(name) + 1, name, what)
        if on_start is not None:
            on_start(started)
        wall, cpu = time.perf_counter(), _cpu_seconds()
        result = step()
        done = replace(started, seconds=time.perf_counter() - wall, cpu_seconds=_cpu_seconds() - cpu)
        report.stages.append(done)
        if on_done is not None:
            on_done(done, result)
        return result

    cfg = plan.workload
    where = "local gloo ranks" if cfg.device == "cpu" else "CUDA rank(s)"
    run_dir = directory / plan.run_id
    report.trained = stage(
        "workload",
        f"train the reference GPT on {cfg.world_size} {where} (pp={cfg.pp} tp={cfg.tp} dp={cfg.dp}), profiled",
        lambda: _train(session, cfg, run_dir),
    )
    run_id = report.trained.run_id
    report.ingested = stage(
        "ingest", f"parse and decode {run_id} into {session.db_path.name}", lambda: _ingest(session, run_dir, run_id)
    )
    settings = replace(
        run_settings(CLUSTER, plan.device, run_id, repeats, passes, processes or plan.pp * plan.tp * plan.dp),
        timing=plan.timing,
    )
    if plan.device == "cpu":
        what = (
            f"time the traced operator shapes and their neighbours on this CPU, {settings.processes} processes at once"
        )
    else:
        what = f"time the traced operator shapes and their neighbours on {plan.device} ({plan.timing})"
    report.sampled = stage("sample", what, lambda: _sample(session, run_id, settings, progress))
    report.calibrated = stage(
        "calibrate",
        f"fit and validate regressors for cluster {CLUSTER!r} (k-fold selection, hold-out errors)",
        lambda: _calibrate(session, progress),
    )
    fitted = report.calibrated.calibration is not None
    busy = report.ingested.busy
    report.predicted = stage(
        "predict",
        "replay the best iteration: measured (fidelity) and predicted (dependency replay)",
        lambda: _predict(session, run_id, report.figures, busy, with_models=fitted),
    )
    return report


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (the workload's ranks)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _train(session: Session, cfg: WorkloadConfig, run_dir: Path) -> Trained:
    result = session.workload_run(run_dir, cfg, force=True)
    return Trained(run_dir, run_dir.name, cfg.world_size, list(result.run["profile"]["profiled_steps"]))


def _ingest(session: Session, run_dir: Path, run_id: str) -> Ingested:
    from tracecal.sql.gpu_busy import gpu_busy

    report = session.ingest_report([run_dir], cluster=CLUSTER, workers=2)
    with session.connect(read_only=True) as con:
        best = con.execute("SELECT iteration, dur_ns FROM best_iteration WHERE run_id = ?", [run_id]).fetchall()
        ops = con.execute("SELECT count(*) FROM operators WHERE run_id = ?", [run_id]).fetchall()[0][0]
        busy = gpu_busy(con, run_id)
    r = report.runs[0]
    return Ingested(r.ranks, r.events, ops, best[0][0], best[0][1] / 1e6, {b.rank: b.busy_share for b in busy})


def _sample(session: Session, run_id: str, settings: Any, progress: Progress | None) -> Sampled:
    from tracecal.samplers.compute import sample_compute
    from tracecal.samplers.from_run import run_points
    from tracecal.samplers.plan import neighbourhood

    def on_point(done: int, total: int, label: str) -> None:
        if progress is not None:
            progress("sample", done, total, label)

    with session.connect() as con:
        plan = run_points(con, run_id, None)
        points = neighbourhood(plan.points)
        report = sample_compute(con, points, settings, progress=on_point, extra_params=plan.params_for)
    return Sampled(len(plan.points), len(points), report.written, len(report.skipped), sum(plan.unmapped.values()))


def _calibrate(session: Session, progress: Progress | None) -> Calibrated:
    def on_group(key: Any, index: int, total: int) -> None:
        if progress is not None:
            progress("calibrate", index, total, f"{key.op} {key.direction}")

    try:
        calibration, _ = session.calibrate_report(CLUSTER, folds=FOLDS, progress=on_group, in_trace=False)
    except (CalibrationError, SampleError) as exc:
        return Calibrated(None, str(exc))
    return Calibrated(calibration, None)


def _predict(session: Session, run_id: str, figures: Path, busy: dict[int, float], *, with_models: bool) -> Predicted:
    import polars as pl

    from tracecal.predict.figures import component_proportions, rank_timeline
    from tracecal.predict.run import slack_report
    from tracecal.predict.store import predict_stored_run, store_prediction
    from tracecal.predict.validate import error_table

    with session.connect() as con:
        _, measured = predict_stored_run(con, run_id, mode="measured")
        store_prediction(con, run_id, measured)
        predicted = None
        if with_models:
            model = session.duration_model(con, CLUSTER)
            _, predicted = predict_stored_run(con, run_id, mode="predicted", model=model, replay=PREDICT_REPLAY)
            store_prediction(con, run_id, predicted, cluster=CLUSTER)
    fidelity = float(measured.iteration_error()["error_pct"].abs().max())  # type: ignore[arg-type]
    it = slack_report(measured).filter(pl.col("component") == "iteration")
    dep, share = it["dependency_error_pct"].abs().max(), it["unexplained_pct"].max()
    shown = predicted or measured
    comps = shown.components.with_columns(pl.lit(run_id).alias("run_id"))
    bars = component_proportions(comps, figures / "component_proportions.png")
    slow = int(shown.iteration_error().sort("measured_ns", descending=True)["rank"][0])
    line = rank_timeline(shown, slow, figures / f"timeline_rank{slow}.png", f"{run_id} rank {slow} ({shown.mode})")
    return Predicted(
        run_id=run_id,
        measured=measured,
        predicted=predicted,
        figures=[bars, line],
        fidelity_pct=fidelity,
        dependency_error_pct=dep if isinstance(dep, float) else None,
        unexplained_pct=share if isinstance(share, float) else None,
        error_table=error_table(comps),
        headline=None if predicted is None else _headline(predicted, busy),
    )


def _headline(predicted: Prediction, busy: dict[int, float]) -> Headline:
    """The score of the slowest rank (measured), with the fitted replay's error beside it."""
    import polars as pl

    it = predicted.iteration_error().sort("measured_ns", descending=True).row(0, named=True)
    fitted = predicted.by_replay("fitted")
    fitted_error = None
    if fitted is not None:
        fitted_error = fitted.iteration_error().filter(pl.col("rank") == it["rank"]).row(0, named=True)["error_pct"]
    rank_comps = predicted.components.filter(pl.col("rank") == it["rank"])
    errors = dict(zip(rank_comps["component"].to_list(), rank_comps["error_pct"].to_list(), strict=True))
    busy_share = busy.get(it["rank"])
    return Headline(
        score=headline_score(busy_share),
        rank=it["rank"],
        replay=predicted.replay,
        iteration_error_pct=it["error_pct"],
        measured_ms=it["measured_ns"] / 1e6,
        predicted_ms=it["predicted_ns"] / 1e6,
        fitted_error_pct=fitted_error,
        model_share=predicted.coverage["all"],
        busy_share=busy_share,
        components={c: errors.get(c) for c in COMPUTE_COMPONENTS if c in errors},
    )

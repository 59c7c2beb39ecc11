"""The compute sampler: time grid points and store them as ``samples`` rows.

``sample_compute(con, points, settings)`` validates every point first (a malformed grid fails before
anything is timed or written), skips the points whose ``sample_id`` is already stored for the cluster
(resumable: an interrupted run continues where it stopped), times the rest one by one — in
``settings.passes`` sweeps over all of them, each sweep timing ``repeats`` calls per point, and in
``settings.processes`` concurrent worker processes (``samplers.concurrent``) — and writes them in
batches through the sample store, each batch in one transaction, a point once its last pass is
measured. Points torch cannot run on this device/dtype are skipped with the reason torch gave, never
faked.

The library never prints: progress goes to an optional callback ``progress(done, total, label)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from tracecal.errors import SampleError
from tracecal.samplers import cases
from tracecal.samplers.concurrent import measure_concurrently
from tracecal.samplers.grid import GridPoint
from tracecal.samplers.rows import SOURCE, sample_row
from tracecal.samplers.timing import (
    SamplerEnv,
    check_timing,
    default_timing,
    method_in_sample_id,
    sampler_env,
    summarize,
    time_call,
    timing_params,
)
from tracecal.schema import SAMPLES, arrow_schema
from tracecal.sql.samples import existing_sample_ids, sample_id, write_samples

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class ComputeSettings:
    """How to sample: where, on what, how often. ``source_file`` names the grid (or run) sampled."""

    cluster: str
    device: str = "cpu"
    warmup: int = 3
    repeats: int = 10
    source_file: str | None = None
    threads: int | None = 1
    """CPU only: torch intra-op threads while sampling (None = torch's default). One by default: on a
    shared or loaded machine, multi-threaded kernels wait for descheduled workers and short kernels
    measure the wait; set it to the thread count of the workload the samples should model."""
    autograd: bool = True
    """Forward samples record the autograd graph, as training forward calls do; False times them
    under ``no_grad`` (inference), recorded in the sample id and ``params_json``."""
    timing: str | None = None
    """How repeats are timed (``timing.TIMING_METHODS``); None = ``default_timing(device)``. On CPU,
    ``profiler`` times the call as a CPU trace measures an operator (its own profiler events). Not
    the default: on the PP2 demo it changed the prediction error by less than the run-to-run noise
    and doubled the sampling time."""
    passes: int = 1
    """Sweeps over all the points, each timing ``repeats`` calls of every point (with its warm-up),
    so a point's repeats are spread over the whole sampling run instead of a few consecutive
    milliseconds: a burst of load from other processes then disturbs one pass of many points, not
    every repeat of one shape and its neighbours (and the calibrated model with them). Samples are
    written when the last pass measured them."""
    processes: int = 1
    """Worker processes timing points at the same time (CPU; ``samplers.concurrent``): set it to the
    number of ranks the modelled workload runs on one node, so samples carry the contention for
    cores, caches and memory bandwidth that each rank's operators met in the trace."""
    flush_every_s: float = 10.0
    """Write finished samples at least this often, so an interruption loses at most this much work."""


@dataclass
class ComputeReport:
    """What a run did: points planned, already stored, written, and skipped (point, reason)."""

    planned: int = 0
    already_stored: int = 0
    written: int = 0
    skipped: list[tuple[GridPoint, str]] = field(default_factory=list)
    seconds: float = 0.0

    def skipped_reasons(self) -> dict[str, int]:
        """Skipped points counted by reason."""
        counts: dict[str, int] = {}
        for _, reason in self.skipped:
            counts[reason] = counts.get(reason, 0) + 1
        return counts


def point_sample_id(
    point: GridPoint,
    cluster: str,
    device_name: str,
    autograd: bool = True,
    timing: str | None = None,
    processes: int = 1,
) -> str:
    """The ``sample_id`` a point gets: cluster, source, op, direction, its shape columns, its grid
    dimensions (some, like the optimizer's tensor count, are not shape columns), the device, the
    timing method unless it is one stored before methods were (``timing.method_in_sample_id``) and
    the concurrent processes when more than one (different measurements of the same call)."""
    features = dict(cases.shape_columns(point))
    features.update({f"dim.{k}": v for k, v in cases.resolved_dims(point).items()})
    features["device_name"] = device_name
    if not autograd and point.direction == "fwd":
        features["inference"] = True  # only when set, so training-mode ids stay as they were
    if timing is not None and method_in_sample_id(timing):
        features["timing"] = timing  # likewise: perf_counter and CUDA-event ids are unchanged
    if processes > 1:
        features["processes"] = processes  # likewise: one-process ids are unchanged
    return sample_id(cluster, SOURCE, point.op, point.direction, features)


def sample_compute(
    con: duckdb.DuckDBPyConnection,
    points: Sequence[GridPoint],
    settings: ComputeSettings,
    progress: Progress | None = None,
    extra_params: Callable[[GridPoint], dict[str, Any]] | None = None,
) -> ComputeReport:
    """Time ``points`` on ``settings.device`` and upsert them into ``samples``; return a report.

    ``extra_params(point)`` adds facts to a row's ``params_json`` (``--from-run`` records the run and
    traced phase there).

    Raises:
        SampleError: a point is malformed (unknown op, bad dimension, dtype), the device is
            unavailable, or ``passes``/``processes`` is below 1; nothing is written in that case. A
            worker process that dies or fails to time also raises it (what was finished is kept).
    """
    started = time.perf_counter()
    env = sampler_env(settings.device)
    report = ComputeReport()
    todo = pending(con, points, settings, env, report)
    if settings.passes < 1:
        raise SampleError(f"--passes must be ≥ 1, not {settings.passes}")
    ids = {point: sid for point, sid in todo}
    timed: dict[str, list[float]] = {}  # sample_id -> durations of the passes so far
    rows: list[dict[str, Any]] = []
    last_flush = time.perf_counter()
    done = 0
    try:
        for index in range(settings.passes):
            last = index == settings.passes - 1
            skipped: set[str] = set()
            for point, row in _outcomes(todo, settings, env, extra_params):
                done += 1
                if isinstance(row, str):
                    report.skipped.append((point, row))
                    skipped.add(ids[point])
                else:
                    durations = timed.setdefault(ids[point], [])
                    durations.extend(row.pop(_DURATIONS))
                    if last:
                        rows.append(_with_stats(row, durations, settings.passes))
                if rows and time.perf_counter() - last_flush >= settings.flush_every_s:
                    report.written += _flush(con, rows)
                    rows = []
                    last_flush = time.perf_counter()
                if progress is not None:
                    progress(done, len(todo) * settings.passes, f"{point.family} {point.op} {point.direction}")
            todo = [(p, sid) for p, sid in todo if sid not in skipped]  # skipped once: not retried
    finally:  # keep what was measured, also on Ctrl-C: the next run resumes after it
        report.written += _flush(con, rows)
    report.seconds = time.perf_counter() - started
    return report


_DURATIONS = "_durations"
"""Key of a measured row's per-repeat durations until the passes are merged (not a column)."""


def _with_stats(row: dict[str, Any], durations: list[float], passes: int) -> dict[str, Any]:
    """``row`` with the statistics of every pass's repeats, and the pass count in ``params_json``."""
    stats = summarize(durations)
    params = msgspec.json.decode(row["params_json"])
    params["passes"] = passes
    return {
        **row,
        "median_ns": stats.median_ns,
        "min_ns": stats.min_ns,
        "iqr_ns": stats.iqr_ns,
        "repeats": stats.repeats,
        "params_json": msgspec.json.encode(params).decode(),
    }


def _outcomes(
    todo: list[tuple[GridPoint, str]],
    settings: ComputeSettings,
    env: SamplerEnv,
    extra_params: Callable[[GridPoint], dict[str, Any]] | None,
) -> Iterator[tuple[GridPoint, dict[str, Any] | str]]:
    """(point, row or skip reason) for every point of ``todo``, in this process or, with
    ``settings.processes`` > 1 on CPU, in that many concurrent worker processes."""

    def measure(point: GridPoint, sid: str) -> dict[str, Any] | str:
        return _measure(point, sid, settings, env, extra_params)

    if settings.processes > 1:
        if settings.device != "cpu":
            raise SampleError("--processes applies to CPU sampling; on GPUs run one sampler per device (--part)")
        yield from measure_concurrently(todo, measure, settings.processes, lambda: _device_scope(settings))
        return
    with _device_scope(settings):
        for point, sid in todo:
            yield point, measure(point, sid)


def pending(
    con: duckdb.DuckDBPyConnection,
    points: Sequence[GridPoint],
    settings: ComputeSettings,
    env: SamplerEnv | None = None,
    report: ComputeReport | None = None,
) -> list[tuple[GridPoint, str]]:
    """The (point, sample_id) pairs still to sample: every point validated, duplicates dropped, ids
    already stored for the cluster left out. Fills ``report.planned``/``already_stored`` when given.

    Raises:
        SampleError: a malformed point, ``bwd`` of an op without a backward, or an unavailable device.
    """
    env = env or sampler_env(settings.device)
    timing = check_timing(settings.timing or default_timing(settings.device), settings.device)
    if settings.processes < 1:
        raise SampleError(f"--processes must be ≥ 1, not {settings.processes}")
    ids = [
        point_sample_id(p, settings.cluster, env.device_name, settings.autograd, timing, settings.processes)
        for p in points
    ]
    for p in points:
        if p.direction == "bwd" and not cases.spec_for(p).has_backward:
            raise SampleError(f"{p.op} has no backward to sample; list it with directions: [fwd]")
    stored = existing_sample_ids(con, settings.cluster)
    unique = dict(zip(ids, points, strict=True))  # a grid may list a point twice: time it once
    todo = [(p, i) for i, p in unique.items() if i not in stored]
    if report is not None:
        report.planned, report.already_stored = len(unique), len(unique) - len(todo)
    return todo


@contextmanager
def _device_scope(settings: ComputeSettings) -> Iterator[None]:
    """For the run: on CPU, torch's intra-op thread count (restored afterwards); on CUDA, the sampled
    device as the current one, so CUDA events and ``synchronize`` act on the device the ops run on."""
    import torch

    if settings.device.startswith("cuda"):
        with torch.cuda.device(torch.device(settings.device)):
            yield
        return
    if settings.threads is None:
        yield
        return
    if settings.threads < 1:
        raise SampleError(f"--threads must be ≥ 1, not {settings.threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _flush(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> int:
    if not rows:
        return 0
    table = pa.Table.from_pylist(rows, schema=arrow_schema(SAMPLES))
    return write_samples(con, table, origin="compute sampler")


def _measure(
    point: GridPoint,
    sid: str,
    settings: ComputeSettings,
    env: SamplerEnv,
    extra_params: Callable[[GridPoint], dict[str, Any]] | None,
) -> dict[str, Any] | str:
    """One sample row, or the reason torch could not run the point here."""
    timing = settings.timing or default_timing(settings.device)
    try:
        built = cases.build(point, settings.device, settings.autograd)
        durations = time_call(built.run, settings.device, settings.warmup, settings.repeats, method=timing)
    except (RuntimeError, NotImplementedError) as exc:  # dtype/op unsupported here, or out of memory
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    input_dims, input_types, concrete = cases.trace_record(point)
    params: dict[str, Any] = {
        "dims": cases.resolved_dims(point),
        "input_dims": input_dims,
        "input_types": input_types,
        "concrete_inputs": concrete,
        "device": settings.device,
        "warmup": settings.warmup,
        "timing": timing,
        "autograd": settings.autograd or point.direction == "bwd",
        "processes": settings.processes,
    }
    import torch

    if settings.device == "cpu":
        params["threads"] = torch.get_num_threads()
    else:  # fp32 GEMMs differ several-fold with TF32: say which was timed
        params["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    params.update(timing_params(timing, settings.device))
    params.update(built.params)
    if extra_params is not None:
        params.update(extra_params(point))
    row = sample_row(
        env,
        sample_id=sid,
        cluster=settings.cluster,
        family=point.family,
        op=point.op,
        direction=point.direction,
        durations_ns=durations,
        params=params,
        source_file=settings.source_file,
        columns={**cases.shape_columns(point), "timing": timing},
    )
    row[_DURATIONS] = durations
    return row

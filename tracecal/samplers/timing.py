"""Timing one call repeatedly, and the environment a sample was taken in.

Contract: ``time_call(fn, device, warmup, repeats)`` runs ``fn`` ``warmup`` times untimed, then
``repeats`` times timed, and returns the per-repeat durations in integer nanoseconds.

- CPU, ``method="perf_counter"`` (the default): ``time.perf_counter_ns`` around each call (the call
  is synchronous).
- CPU, ``method="profiler"``: warm-up and repeats run under ``torch.profiler`` (CPU activity,
  ``record_shapes=True`` without scalar-list arguments, as the reference workload traces), each repeat inside a
  ``REPEAT_MARK`` range; a repeat's duration is the sum of the profiler's own events for the call:
  the marker's direct children for a forward call (``aten::linear``, ``Optimizer.step#Adam.step``),
  the autograd node events (``MmBackward0``, not the engine's ``AccumulateGrad``) for a backward.
  This is how a CPU trace measures an operator, so samples and traced operators agree on what the
  profiler's bookkeeping adds inside an event and on the Python overhead outside it.
- CUDA: one pair of CUDA events per repeat recorded on the current stream around the call, one
  ``torch.cuda.synchronize()`` after the last repeat, then ``Event.elapsed_time`` (ms, float) for each
  pair. The device is synchronised before the first timed repeat so warm-up work queued on the stream
  is not billed to repeat 0. Before each repeat (outside its events) a ``flush_bytes`` buffer is
  zeroed, so the call does not find its inputs in L2 from the previous repeat — in training the
  preceding kernels have evicted them (Triton's ``do_bench`` does the same). (Written for GPUs; only
  the CPU path runs on this project's CI machine.)

``TIMING_METHODS`` names the methods as recorded in ``params_json.timing``; ``default_timing(device)``
is CUDA events on a GPU and ``perf_counter`` on CPU.

``summarize(durations_ns)`` turns durations into the statistics stored in ``samples``: median, min,
inter-quartile range (NULL for a single repeat) and n.
"""

from __future__ import annotations

import platform
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tracecal.errors import SampleError


@dataclass(frozen=True)
class TimingStats:
    """Duration statistics of one sample, in nanoseconds (``samples`` columns of the same names)."""

    median_ns: float
    min_ns: float
    iqr_ns: float | None
    repeats: int


def summarize(durations_ns: Sequence[float]) -> TimingStats:
    """Median, minimum, inter-quartile range (NULL for one repeat) and count of ``durations_ns``.

    Raises:
        SampleError: no durations, or a negative duration (a broken clock or timer).
    """
    values = sorted(float(d) for d in durations_ns)
    if not values:
        raise SampleError("no timed repeats to summarise; use --repeats 1 or more")
    if values[0] < 0:
        raise SampleError(f"negative duration {values[0]} ns measured; the timer is broken")
    iqr: float | None = None
    if len(values) > 1:
        # 'inclusive' interpolates between observed values, so IQR ≥ 0 and is 0 for constant input.
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        iqr = q3 - q1
    return TimingStats(statistics.median(values), values[0], iqr, len(values))


L2_FLUSH_BYTES = 256 << 20
"""Zeroed between CUDA repeats: larger than the L2 of current GPUs (A100 40 MB, H100 50 MB)."""


TIMING_METHODS = ("perf_counter", "profiler", "cuda_events")
"""How a sample's repeats are timed (``params_json.timing``)."""

REPEAT_MARK = "tracecal::sample_repeat"
"""The profiler range around one timed repeat (``method="profiler"``)."""


def default_timing(device: str) -> str:
    """CUDA events on a GPU, ``perf_counter`` on CPU."""
    return "cuda_events" if device.startswith("cuda") else "perf_counter"


def check_timing(method: str, device: str) -> str:
    """``method`` if it can time on ``device``, else SampleError naming the methods that can."""
    cuda = device.startswith("cuda")
    allowed = ("cuda_events",) if cuda else ("perf_counter", "profiler")
    if method not in allowed:
        raise SampleError(f"--timing {method} cannot time on {device}; use {' or '.join(allowed)}")
    return method


def time_call(
    fn: Callable[[], Any],
    device: str,
    warmup: int,
    repeats: int,
    flush_bytes: int = L2_FLUSH_BYTES,
    method: str | None = None,
) -> list[float]:
    """Per-repeat durations of ``fn()`` in ns on ``device`` ("cpu" or "cuda[:i]") timed by ``method``
    (``default_timing(device)`` when None); ``flush_bytes`` (CUDA only, 0 = off) is the cache-flush
    buffer zeroed before each repeat.

    Raises:
        SampleError: bad repeats/warm-up, a method that cannot time on ``device``, or (profiler) a
            repeat in which the profiler recorded no event of the call.
    """
    if repeats < 1 or warmup < 0:
        raise SampleError(f"need --repeats ≥ 1 and --warmup ≥ 0 (got {repeats}, {warmup})")
    method = check_timing(method or default_timing(device), device)
    if method == "profiler":
        return _time_profiler(fn, warmup, repeats)
    for _ in range(warmup):
        fn()
    if method == "cuda_events":
        return _time_cuda(fn, repeats, flush_bytes)
    out: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        out.append(float(time.perf_counter_ns() - start))
    return out


def _time_cuda(fn: Callable[[], Any], repeats: int, flush_bytes: int) -> list[float]:
    import torch

    flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda") if flush_bytes > 0 else None
    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeats):
        if flush is not None:
            flush.zero_()  # queued before the start event: evicts L2, not timed
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e6 for s, e in pairs]  # ms -> ns


def _time_profiler(fn: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
    from tracecal.workload.train import record_scalar_lists, records_scalar_lists

    # the reference workload's profiler settings on CPU; the switch is process-wide, so torch's
    # default (on) is restored after timing
    record_scalar_lists(records_scalar_lists("cpu"))
    try:
        return _profiled_repeats(fn, warmup, repeats)
    finally:
        record_scalar_lists(True)


def _profiled_repeats(fn: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
    from torch.profiler import ProfilerActivity, profile, record_function

    # Warm-up runs under the profiler too: its first recorded calls pay one-off set-up.
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(warmup):
            fn()
        for _ in range(repeats):
            with record_function(REPEAT_MARK):
                fn()
    marks = sorted((e for e in prof.events() if e.name == REPEAT_MARK), key=lambda e: e.time_range.start)
    if len(marks) != repeats:
        raise SampleError(f"the profiler recorded {len(marks)} of {repeats} repeats; use --timing perf_counter")
    out = []
    for mark in marks:
        own = call_events(mark.cpu_children)
        if not own:
            raise SampleError("the profiler recorded no event of the timed call; use --timing perf_counter")
        out.append(sum(e.time_range.elapsed_us() for e in own) * 1e3)  # µs (float) -> ns
    return out


_ENGINE = "autograd::engine::evaluate_function: "


def call_events(children: Sequence[Any]) -> list[Any]:
    """The events that are the timed call itself among a repeat marker's direct children: for a
    backward (the autograd engine's ``evaluate_function`` ranges) the backward nodes inside them,
    leaving out ``AccumulateGrad`` (the engine storing ``.grad``, not the op's backward); for a
    forward the children themselves (the op's top-level event)."""
    engine = [c for c in children if c.name.startswith(_ENGINE)]
    if not engine:
        return list(children)
    return [n for c in engine if "AccumulateGrad" not in c.name for n in c.cpu_children]


@dataclass(frozen=True)
class SamplerEnv:
    """Where a sample was taken: stored on every sample row."""

    device_name: str
    host: str
    torch_version: str
    cuda_version: str | None
    nccl_version: str | None


def cpu_name() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux, else platform.processor())."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def sampler_env(device: str, *, distributed_backend: str | None = None) -> SamplerEnv:
    """Describe ``device`` and the library versions; NCCL's version only when it is the backend."""
    import torch

    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SampleError("--device cuda given but torch sees no CUDA device; use --device cpu")
    name = torch.cuda.get_device_name(torch.device(device)) if cuda else cpu_name()
    nccl = None
    if cuda and distributed_backend == "nccl":
        version = torch.cuda.nccl.version()
        nccl = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    return SamplerEnv(
        device_name=name,
        host=socket.gethostname(),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda if cuda else None,
        nccl_version=nccl,
    )

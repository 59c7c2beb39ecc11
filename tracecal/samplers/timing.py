"""Timing one call repeatedly, and the environment a sample was taken in.

Contract: ``time_call(fn, device, warmup, repeats, method=...)`` runs ``fn`` ``warmup`` times untimed,
then ``repeats`` times timed, and returns one duration per repeat in nanoseconds. What a duration is
depends on the method (``params_json.timing`` and the ``samples.timing`` column name it):

- CPU, ``perf_counter`` (the default): ``time.perf_counter_ns`` around each call (the call is
  synchronous).
- CPU, ``profiler``: warm-up and repeats run under ``torch.profiler`` (CPU activity,
  ``record_shapes=True`` without scalar-list arguments, as the reference workload traces), each repeat
  inside a ``REPEAT_MARK`` range; a repeat's duration is the sum of the profiler's own events for the
  call: the marker's direct children for a forward call (``aten::linear``,
  ``Optimizer.step#Adam.step``), the autograd node events (``MmBackward0``, not the engine's
  ``AccumulateGrad``) for a backward. This is how a CPU trace measures an operator.
- CUDA, ``cuda_burst`` (the default): what a GPU trace measures of an operator is its kernels'
  durations, not the launch gaps around them. Each repeat is a burst of ``BURST_CALLS`` calls launched
  back to back between two CUDA events, each call preceded by the L2 flush (``flush_bytes`` zeroed,
  0 = off). The CPU's launch time is kept out of it: a sleep kernel holds the stream until the whole
  burst is queued, and the burst is timed again with a longer hold when the CPU took longer to queue
  it than the GPU slept (``hold_for``). The fixed costs (the events, the flushes and their launches)
  are measured by a baseline burst of the flushes alone and removed:
  ``(burst - median baseline) / BURST_CALLS`` (``per_call_ns``). What remains above the kernels'
  own durations is the GPU's gap between back-to-back kernels, about a microsecond per kernel.
- CUDA, ``profiler``: warm-up and repeats under ``torch.profiler`` with CUDA activity, the flush before
  each repeat outside its ``REPEAT_MARK`` range; a repeat's duration is the summed duration of the GPU
  activities (kernels, memcpy, memset) launched by CPU events inside the mark's time window, on any
  thread (a CUDA backward runs in the autograd engine's device thread): exactly what a trace's
  operator rows hold (``kernel_time_ns``). It costs a profiler session per point and pass.
- CUDA, ``cuda_events``: one pair of CUDA events around each single call, after the flush. Kept to
  reproduce older samples: it reads the launch latency too (5–80 % above the kernel on an H200,
  docs/samples.md#timing).

``TIMING_METHODS`` names the methods; ``methods_for(device)`` lists those that can time on a device,
the default first; ``default_timing(device)`` is that first one.

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
"""Zeroed before each timed CUDA call: larger than the L2 of current GPUs (A100 40 MB, H100 50 MB)."""

CPU_METHODS = ("perf_counter", "profiler")
"""Methods that time on a CPU, the default first."""
CUDA_METHODS = ("cuda_burst", "profiler", "cuda_events")
"""Methods that time on a CUDA device, the default first (docs/samples.md#timing says why)."""
TIMING_METHODS = ("perf_counter", "profiler", "cuda_events", "cuda_burst")
"""How a sample's repeats are timed (``params_json.timing``, ``samples.timing``)."""

LEGACY_ID_METHODS = ("perf_counter", "cuda_events")
"""Methods whose samples were stored before the method was part of the sample id: their ids leave
it out, so stored samples keep their ids (and a resumed run its progress)."""

REPEAT_MARK = "tracecal::sample_repeat"
"""The profiler range around one timed repeat (``method="profiler"``)."""

BURST_CALLS = 10
"""Calls per ``cuda_burst`` repeat. The fixed costs are subtracted, so the count trades time for the
averaging of the GPU's jitter: 10 calls of the demo's ~1 000 shapes keep sampling within minutes."""

MIN_HOLD_NS = 50_000.0
"""The shortest hold of the stream before a burst: more than the launch of the first few calls."""

HOLD_MARGIN = 1.5
"""A burst's hold is this many times what queueing the previous burst of its kind took."""

HOLD_TRIES = 4
"""Bursts timed with a doubled hold before a call whose launches the GPU keeps overtaking is skipped."""


def methods_for(device: str) -> tuple[str, ...]:
    """The timing methods that can time on ``device``, the default first."""
    return CUDA_METHODS if device.startswith("cuda") else CPU_METHODS


def default_timing(device: str) -> str:
    """``cuda_burst`` on a GPU, ``perf_counter`` on CPU."""
    return methods_for(device)[0]


def check_timing(method: str, device: str) -> str:
    """``method`` if it can time on ``device``, else SampleError naming the methods that can."""
    allowed = methods_for(device)
    if method not in allowed:
        raise SampleError(f"--timing {method} cannot time on {device}; use {' or '.join(allowed)}")
    return method


def method_in_sample_id(method: str) -> bool:
    """Whether a sample's id records its timing method (all but ``LEGACY_ID_METHODS``): the same call
    timed two ways is two samples."""
    return method not in LEGACY_ID_METHODS


def timing_params(method: str, device: str, flush_bytes: int = L2_FLUSH_BYTES) -> dict[str, object]:
    """What ``params_json`` records about how a sample was timed, beside ``timing``: the L2 flush on
    CUDA, the burst length for ``cuda_burst``."""
    if not device.startswith("cuda"):
        return {}
    params: dict[str, object] = {"l2_flush_bytes": flush_bytes}
    if method == "cuda_burst":
        params["burst_calls"] = BURST_CALLS
    return params


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
    buffer zeroed before each timed call.

    Raises:
        SampleError: bad repeats/warm-up, or a method that cannot time on ``device``.
        RuntimeError: this call cannot be timed by the method (the sampler skips the point with the
            reason): the profiler recorded no event or no GPU work of it, or a burst whose launches
            the GPU kept overtaking, or that the flush's jitter swamps.
    """
    if repeats < 1 or warmup < 0:
        raise SampleError(f"need --repeats ≥ 1 and --warmup ≥ 0 (got {repeats}, {warmup})")
    method = check_timing(method or default_timing(device), device)
    cuda = device.startswith("cuda")
    if method == "profiler":
        if cuda:
            return _time_profiler_cuda(fn, warmup, repeats, flush_bytes)
        return _time_profiler(fn, warmup, repeats)
    for _ in range(warmup):
        fn()
    if method == "cuda_events":
        return _time_cuda(fn, repeats, flush_bytes)
    if method == "cuda_burst":
        return burst_durations(_cuda_burst_runner(fn, flush_bytes), repeats, BURST_CALLS)
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


# --- cuda_burst -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BurstTime:
    """One burst as the device and the host saw it (ns)."""

    gpu_ns: float
    """Between the burst's two CUDA events."""
    queued_ns: float
    """Host time from holding the stream to the end event queued: how long the CPU took to launch."""
    held_ns: float
    """How long the sleep kernel held the stream before the burst (CUDA events around it)."""


BurstRunner = Callable[[bool, float], BurstTime]
"""``run(with_call, hold_ns)``: one burst of ``BURST_CALLS`` flushes, each followed by the timed call
when ``with_call`` (else the baseline), behind a hold of the stream of about ``hold_ns``."""


def per_call_ns(bursts_ns: Sequence[float], baselines_ns: Sequence[float], calls: int) -> list[float]:
    """Per-call duration of each burst: the burst less the median baseline (the events, flushes and
    their launches, measured the same way without the call), over the calls in a burst."""
    if calls < 1 or not baselines_ns:
        raise SampleError(f"a burst needs ≥ 1 call and a baseline (got {calls} calls, {len(baselines_ns)} baselines)")
    base = statistics.median(baselines_ns)
    return [(b - base) / calls for b in bursts_ns]


def hold_for(queued_ns: float) -> float:
    """The hold to give the next burst: ``HOLD_MARGIN`` times what queueing the last one took, at least
    ``MIN_HOLD_NS``. The GPU sleeps while the CPU queues, so the hold costs little wall time beyond
    the queueing itself."""
    return max(MIN_HOLD_NS, HOLD_MARGIN * queued_ns)


def launches_hidden(burst: BurstTime) -> bool:
    """Whether the GPU reached the burst only after the CPU had queued all of it. The sleep starts no
    earlier than it was queued, so a hold at least as long as the queueing took is sufficient: no
    kernel of the burst then waited for its launch."""
    return burst.held_ns >= burst.queued_ns


def burst_durations(run: BurstRunner, repeats: int, calls: int) -> list[float]:
    """``repeats`` per-call durations from bursts of ``calls`` calls, each against a baseline burst
    taken just before it. A burst the GPU caught up with while it was being queued is timed again
    with a longer hold (``HOLD_TRIES`` times).

    Raises:
        RuntimeError: the launches could not be hidden, or a per-call duration is not positive (the
            call is shorter than the jitter of the flushes): the sampler skips the point, saying so.
    """
    hold = {False: MIN_HOLD_NS, True: MIN_HOLD_NS}  # baseline and call bursts queue at their own pace

    def timed(with_call: bool) -> float:
        for _ in range(HOLD_TRIES):
            burst = run(with_call, hold[with_call])
            if launches_hidden(burst):
                hold[with_call] = hold_for(burst.queued_ns)
                return burst.gpu_ns
            hold[with_call] = 2 * hold_for(burst.queued_ns)
        raise RuntimeError(
            f"the GPU kept overtaking the CPU's launches of a burst ({burst.queued_ns / 1e3:.0f} µs to queue, "
            f"held {burst.held_ns / 1e3:.0f} µs); time this op with --timing profiler"
        )

    baselines, bursts = [], []
    for _ in range(repeats):
        baselines.append(timed(False))
        bursts.append(timed(True))
    durations = per_call_ns(bursts, baselines, calls)
    if min(durations) <= 0:
        raise RuntimeError(
            f"a burst of {calls} calls took no longer than its flushes alone ({min(durations):.0f} ns per call): the "
            "call is shorter than the flushes' jitter; time it with --timing profiler"
        )
    return durations


_SLEEP_CYCLES_PER_NS: dict[int, float] = {}
"""Per CUDA device: clock cycles of ``torch.cuda._sleep`` per ns, measured once per process."""


def _sleep_cycles_per_ns(torch: Any) -> float:
    device = torch.cuda.current_device()
    if device not in _SLEEP_CYCLES_PER_NS:
        cycles = 1_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # the first launch pays for loading the kernel
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_NS[device] = cycles / max(start.elapsed_time(end) * 1e6, 1.0)
    return _SLEEP_CYCLES_PER_NS[device]


def _cuda_burst_runner(fn: Callable[[], Any], flush_bytes: int) -> BurstRunner:
    """Bursts of ``fn`` on the current CUDA stream (``BurstRunner``)."""
    import torch

    if not hasattr(torch.cuda, "_sleep"):
        raise SampleError("--timing cuda_burst needs torch.cuda._sleep, which this torch lacks; use --timing profiler")
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda") if flush_bytes > 0 else None
    cycles_per_ns = _sleep_cycles_per_ns(torch)

    def run(with_call: bool, hold_ns: float) -> BurstTime:
        hold_start, held, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        torch.cuda.synchronize()  # the previous burst is done: the hold starts on an idle stream
        queueing = time.perf_counter_ns()
        hold_start.record()
        torch.cuda._sleep(max(1, int(hold_ns * cycles_per_ns)))
        held.record()
        start.record()
        for _ in range(BURST_CALLS):
            if flush is not None:
                flush.zero_()  # evicts L2 as the preceding kernels of a training step would
            if with_call:
                fn()
        end.record()
        queued_ns = float(time.perf_counter_ns() - queueing)
        end.synchronize()
        ms = 1e6  # elapsed_time is in ms
        return BurstTime(start.elapsed_time(end) * ms, queued_ns, hold_start.elapsed_time(held) * ms)

    return run


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


def _time_profiler_cuda(fn: Callable[[], Any], warmup: int, repeats: int, flush_bytes: int) -> list[float]:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda") if flush_bytes > 0 else None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        for _ in range(repeats):
            if flush is not None:
                flush.zero_()  # outside the mark: its kernel is not the call's
            with record_function(REPEAT_MARK):
                fn()
        torch.cuda.synchronize()
    cpu = [e for e in prof.events() if e.device_type == DeviceType.CPU and not e.is_async]
    if any(e.is_legacy for e in cpu):
        # without CUPTI, torch falls back to CUDA events around every op: no kernel records
        raise SampleError("torch.profiler recorded no CUDA kernels here (no CUPTI); use --timing cuda_burst")
    marks = [e for e in cpu if e.name == REPEAT_MARK]
    if len(marks) != repeats:
        raise RuntimeError(f"the profiler recorded {len(marks)} of {repeats} repeats; use --timing cuda_burst")
    return kernel_time_ns(marks, cpu)


def kernel_time_ns(marks: Sequence[Any], cpu_events: Sequence[Any]) -> list[float]:
    """Per repeat marker (profiler ``FunctionEvent``s), the summed duration of the GPU activities
    launched by the CPU events that start inside the marker's time window, on any thread (a CUDA
    backward runs in the autograd engine's device thread, not under the marker). Each activity is
    attached to one CPU event (``FunctionEvent.kernels``, µs), so none is counted twice.

    Raises:
        RuntimeError: a repeat launched no GPU work (nothing to time on the GPU).
    """
    out = []
    for mark in sorted(marks, key=lambda e: e.time_range.start):
        lo, hi = mark.time_range.start, mark.time_range.end
        inside = (e for e in cpu_events if lo <= e.time_range.start and e.time_range.end <= hi)
        kernels = [k.duration for e in inside for k in e.kernels]
        if not kernels:
            raise RuntimeError("the timed call launched no GPU work; time it with --timing cuda_burst")
        out.append(sum(kernels) * 1e3)  # µs -> ns
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

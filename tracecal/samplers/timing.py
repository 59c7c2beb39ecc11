"""Timing one call repeatedly, and the environment a sample was taken in.

Contract: ``time_call(fn, device, warmup, repeats)`` runs ``fn`` ``warmup`` times untimed, then
``repeats`` times timed, and returns the per-repeat durations in integer nanoseconds.

- CPU: ``time.perf_counter_ns`` around each call (the call is synchronous).
- CUDA: one pair of CUDA events per repeat recorded on the current stream around the call, one
  ``torch.cuda.synchronize()`` after the last repeat, then ``Event.elapsed_time`` (ms, float) for each
  pair. The device is synchronised before the first timed repeat so warm-up work queued on the stream
  is not billed to repeat 0. Before each repeat (outside its events) a ``flush_bytes`` buffer is
  zeroed, so the call does not find its inputs in L2 from the previous repeat — in training the
  preceding kernels have evicted them (Triton's ``do_bench`` does the same). (Written for GPUs; only
  the CPU path runs on this project's CI machine.)

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


def time_call(
    fn: Callable[[], Any], device: str, warmup: int, repeats: int, flush_bytes: int = L2_FLUSH_BYTES
) -> list[float]:
    """Per-repeat durations of ``fn()`` in ns on ``device`` ("cpu" or "cuda[:i]"); ``flush_bytes``
    (CUDA only, 0 = off) is the cache-flush buffer zeroed before each repeat."""
    if repeats < 1 or warmup < 0:
        raise SampleError(f"need --repeats ≥ 1 and --warmup ≥ 0 (got {repeats}, {warmup})")
    for _ in range(warmup):
        fn()
    if device.startswith("cuda"):
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

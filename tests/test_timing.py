"""How a sample is timed (samplers/timing.py): the method each device uses, the burst arithmetic and
its launch hiding on a fake GPU clock, kernel attribution from profiler events, and the method a
stored sample carries (docs/samples.md#timing)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import SHARED_DATA
from tracecal.errors import SampleError
from tracecal.samplers.timing import (
    MIN_HOLD_NS,
    BurstTime,
    burst_durations,
    check_timing,
    default_timing,
    kernel_time_ns,
    per_call_ns,
    time_call,
)

H200 = SHARED_DATA / "gpu" / "h200"


def test_each_device_has_its_methods_and_a_default() -> None:
    assert default_timing("cpu") == "perf_counter"
    assert default_timing("cuda") == default_timing("cuda:1") == "cuda_burst"
    for method in ("cuda_burst", "profiler", "cuda_events"):
        assert check_timing(method, "cuda:0") == method
    assert check_timing("profiler", "cpu") == "profiler"  # on CPU: the CPU profiler's own events
    with pytest.raises(SampleError, match=r"^--timing cuda_burst cannot time on cpu; use perf_counter or profiler$"):
        check_timing("cuda_burst", "cpu")
    with pytest.raises(SampleError, match="--timing perf_counter cannot time on cuda; use cuda_burst or profiler"):
        check_timing("perf_counter", "cuda")


class FakeGpu:
    """A GPU clock: every burst costs the events' overhead, one flush per call, and the call's kernel
    with its gap when timed; the host takes ``queue_ns`` to queue a burst, and the sleep holds the
    stream exactly as long as asked."""

    def __init__(self, call_ns: float, flush_ns: float = 90_000, overhead_ns: float = 7_000, queue_ns: float = 0):
        self.call_ns, self.flush_ns, self.overhead_ns, self.queue_ns = call_ns, flush_ns, overhead_ns, queue_ns
        self.holds: list[tuple[bool, float]] = []

    def __call__(self, with_call: bool, hold_ns: float) -> BurstTime:
        self.holds.append((with_call, hold_ns))
        gpu = self.overhead_ns + 10 * (self.flush_ns + (self.call_ns if with_call else 0))
        return BurstTime(gpu_ns=gpu, queued_ns=self.queue_ns * (2 if with_call else 1), held_ns=hold_ns)


def test_a_burst_less_its_baseline_is_the_call_alone() -> None:
    gpu = FakeGpu(call_ns=44_300)
    assert burst_durations(gpu, repeats=3, calls=10) == [44_300] * 3
    # a baseline before each burst: the flushes, the events and their launches are measured, not assumed
    assert [with_call for with_call, _ in gpu.holds] == [False, True] * 3
    # the median baseline: one disturbed baseline does not move the result
    assert per_call_ns([1_000_000, 1_000_000], [500_000, 500_000, 900_000], 10) == [50_000, 50_000]


def test_a_burst_the_gpu_caught_up_with_is_timed_again_with_a_longer_hold() -> None:
    gpu = FakeGpu(call_ns=8_000, queue_ns=120_000)  # a backward: slower to launch than the first hold
    assert burst_durations(gpu, repeats=2, calls=10) == [8_000, 8_000]
    first_baseline, second = gpu.holds[0], gpu.holds[1]
    assert first_baseline == (False, MIN_HOLD_NS) and second[0] is False and second[1] >= 120_000
    calls = [hold for with_call, hold in gpu.holds if with_call]
    assert calls[0] == MIN_HOLD_NS and calls[1] >= 240_000  # the call burst queues in 240 µs
    assert calls[-1] >= 240_000  # the hold that worked is kept


def test_launches_that_cannot_be_hidden_or_a_call_below_the_noise_skip_the_point() -> None:
    class NeverHeld(FakeGpu):
        def __call__(self, with_call: bool, hold_ns: float) -> BurstTime:
            return BurstTime(1e6, 1e6, 0.0)  # the sleep never holds the stream

    with pytest.raises(RuntimeError, match=r"kept overtaking the CPU's launches.*--timing profiler"):
        burst_durations(NeverHeld(0), repeats=1, calls=10)
    with pytest.raises(RuntimeError, match="shorter than the flushes' jitter; time it with --timing profiler"):
        burst_durations(FakeGpu(call_ns=0), repeats=1, calls=10)


def _event(start: float, end: float, kernels: tuple[float, ...] = (), name: str = "op") -> Any:
    return SimpleNamespace(
        name=name,
        time_range=SimpleNamespace(start=start, end=end),
        kernels=[SimpleNamespace(duration=d) for d in kernels],
    )


def test_profiler_kernel_time_counts_the_kernels_launched_inside_each_repeat_on_any_thread() -> None:
    marks = [_event(100, 200, name="mark"), _event(0, 50, name="mark")]
    events = [
        *marks,
        _event(10, 40, (3.0,)),  # repeat 1 (sorted by start): its kernel
        _event(60, 70, (90.0,)),  # between repeats: the flush, not timed
        _event(110, 150, (20.0, 5.5)),  # repeat 2: a forward launching two kernels
        _event(160, 190, (7.0,)),  # repeat 2: the autograd device thread's backward op, not under the mark
        _event(195, 260, (1000.0,)),  # ends after the mark: not the call's
    ]
    assert kernel_time_ns(marks, events) == [3_000.0, 32_500.0]
    with pytest.raises(RuntimeError, match="launched no GPU work"):
        kernel_time_ns([_event(300, 400)], events)


def test_profiler_timing_on_cpu_is_the_cpu_profilers_result() -> None:
    import torch

    a = torch.randn(64, 64)
    durations = time_call(lambda: torch.mm(a, a), "cpu", warmup=1, repeats=2, method="profiler")
    assert len(durations) == 2 and all(d > 0 for d in durations)


def test_sample_ids_keep_their_old_form_for_the_old_methods_only() -> None:
    from tracecal.samplers.compute import point_sample_id
    from tracecal.samplers.grid import GridPoint

    mm = GridPoint("gemm", "aten::mm", "fwd", "bfloat16", (("m", 4096), ("n", 2048), ("k", 2048)))
    ids = {m: point_sample_id(mm, "h200", "NVIDIA H200", timing=m) for m in ("cuda_events", "cuda_burst", "profiler")}
    assert ids["cuda_events"] == point_sample_id(mm, "h200", "NVIDIA H200")  # stored samples keep their ids
    assert len(set(ids.values())) == 3  # the same call timed three ways: three samples


def test_samples_exported_before_the_timing_column_say_how_they_were_timed(tmp_path: Path) -> None:
    """The H200 samples were exported before ``samples.timing`` existed: the column is filled from
    their params_json on import."""
    from typer.testing import CliRunner

    from tracecal.cli.main import app
    from tracecal.sql.connection import open_database

    db = tmp_path / "s.duckdb"
    parquet = H200 / "samples" / "h200_samples.parquet"
    result = CliRunner().invoke(app, ["samples", "import", str(parquet), "--format", "parquet", "--db", str(db)])
    assert result.exit_code == 0, result.output
    with open_database(db, read_only=True) as con:
        assert con.execute("SELECT timing, count(*) FROM samples GROUP BY ALL").fetchall() == [("cuda_events", 1039)]


def test_the_timing_probe_summary_reads_each_method_against_the_profilers_kernel_time() -> None:
    """benchmarks/timing_methods.py on the shared H200 probe: the figures docs/samples.md#timing cites."""
    import importlib.util

    path = Path(__file__).parents[1] / "benchmarks" / "timing_methods.py"
    spec = importlib.util.spec_from_file_location("timing_methods", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = json.loads((H200 / "timing_probe.json").read_text())
    assert bench.reference_of(rows) == "prof_flush"
    lines = bench.summary(rows)
    assert "| burst | -9.3 | +1.0 | +3.6 | +1.05 |" in lines
    assert "| ev_flush | -6.8 | +22.7 | +55.6 | +22.64 |" in lines
    assert sum(line.startswith("| 4096×32000×2048 |") for line in lines) == 3  # the LM head, 3 layouts

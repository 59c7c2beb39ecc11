"""Sampler cost: tracecal's timing next to the published profiler-based method, and the local comm start-up.

    python benchmarks/sampler_timing.py               # CPU, the forward ops of the shipped `ci` grid
    python benchmarks/sampler_timing.py --repeat 3

Compute, per forward op of the `ci` grid (same tensors, same process, one thread):
- ``tracecal``: ``timing.time_call`` with 3 warm-up calls and 10 timed calls (``perf_counter_ns``);
- ``profiler``: the published sampler's method (GPUModeling25 §5.3): ``torch.profiler`` with
  ``record_shapes`` and schedule wait/warmup/active = 4/6/10, the trace exported to a file and read
  back, the op's events sorted, the mean of the 3rd–7th fastest.
Prints the wall time per sample of both and their ratio, and each op's value under both methods
(the profiler's own overhead inflates short ops).

Comm: wall time of ``spawn_local`` (2 gloo ranks, one all_reduce of 4 KiB) with ranks started by
``fork`` (what tracecal does) and by ``spawn`` (a fresh interpreter that imports torch again).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tracecal.samplers import cases, comm, comm_launch
from tracecal.samplers.grid import load_grid
from tracecal.samplers.timing import summarize, time_call


def profiler_value_ns(run: Any, op: str, tmp: Path) -> float | None:
    """The published method: profile 4/6/10 steps, export, read back, mean of the 3rd-7th fastest."""
    schedule = torch.profiler.schedule(wait=4, warmup=6, active=10)
    trace = tmp / "trace.json"

    def save(prof: Any) -> None:
        prof.export_chrome_trace(str(trace))

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, schedule=schedule, on_trace_ready=save
    ) as prof:
        for _ in range(20):
            run()
            prof.step()
    events = json.loads(trace.read_text())["traceEvents"]
    durs = sorted(e["dur"] * 1000.0 for e in events if e.get("name") == op and e.get("ph") == "X")
    return statistics.fmean(durs[2:7]) if len(durs) >= 7 else None


def best_of(repeat: int, fn: Any) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def comm_startup(method: str) -> float:
    settings = comm.CommSettings("bench", collectives=("all_reduce",), sizes_bytes=(4096,), warmup=1, repeats=2)
    original = multiprocessing.get_all_start_methods
    if method == "spawn":
        multiprocessing.get_all_start_methods = lambda: ["spawn"]  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        comm_launch.spawn_local(settings, 2)
        return time.perf_counter() - start
    finally:
        multiprocessing.get_all_start_methods = original  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="best of N for each measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread")
    seen: set[str] = set()
    rows = []
    total_ours = total_theirs = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for point in load_grid("ci").points:
            if point.direction != "fwd" or point.op in seen or point.family == "optimizer":
                continue
            seen.add(point.op)
            built = cases.build(point, "cpu")
            value: dict[str, float] = {}

            def ours(built: Any = built, value: dict[str, float] = value) -> None:
                value["ours"] = summarize(time_call(built.run, "cpu", 3, 10)).median_ns

            def theirs(built: Any = built, op: str = point.op, value: dict[str, float] = value) -> None:
                value["theirs"] = profiler_value_ns(built.run, op, Path(tmp)) or float("nan")

            t_ours, t_theirs = best_of(args.repeat, ours), best_of(args.repeat, theirs)
            total_ours += t_ours
            total_theirs += t_theirs
            rows.append((point.op, t_ours, t_theirs, value["ours"], value["theirs"]))
    print(f"\n{'op':36} {'tracecal s':>10} {'profiler s':>10} {'ratio':>6} {'tracecal µs':>11} {'profiler µs':>11}")
    for op, a, b, va, vb in rows:
        print(f"{op:36} {a:10.4f} {b:10.4f} {b / a:6.1f} {va / 1e3:11.1f} {vb / 1e3:11.1f}")
    label = f"all {len(rows)} ops"
    print(f"{label:36} {total_ours:10.4f} {total_theirs:10.4f} {total_theirs / total_ours:6.1f}")
    fork, spawn = comm_startup("fork"), comm_startup("spawn")
    print(f"\ncomm sampler, 2 local gloo ranks, one all_reduce: fork {fork:.2f} s, spawn {spawn:.2f} s", end="")
    print(f", ratio {spawn / fork:.1f}")


if __name__ == "__main__":
    main()

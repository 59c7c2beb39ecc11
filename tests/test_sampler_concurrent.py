"""Concurrent compute sampling (``--processes``) and the host allocator setting shared with the workload."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import orjson
import pytest

from tracecal.errors import SampleError
from tracecal.samplers.compute import ComputeSettings, sample_compute
from tracecal.samplers.concurrent import measure_concurrently
from tracecal.samplers.grid import GridPoint, load_grid
from tracecal.sql.connection import open_database


def _points(n: int) -> list[GridPoint]:
    return [p for p in load_grid("ci").points if p.family in ("gemm", "elementwise")][:n]


def test_two_processes_sample_every_point_once_and_record_it(db_path: Path) -> None:
    points = _points(8)
    two = ComputeSettings(cluster="ci-cpu", warmup=1, repeats=3, processes=2)
    seen: list[int] = []
    with open_database(db_path) as con:
        report = sample_compute(con, points, two, progress=lambda done, total, label: seen.append(done))
        assert (report.planned, report.written, report.skipped) == (8, 8, [])
        assert seen == list(range(1, 9))
        rows = con.execute("SELECT op, direction, median_ns, repeats, params_json FROM samples").fetchall()
        assert sorted((r[0], r[1]) for r in rows) == sorted((p.op, p.direction) for p in points)
        for _, _, median, repeats, params in rows:
            facts = orjson.loads(params)
            assert median > 0 and repeats == 3
            assert facts["processes"] == 2 and facts["threads"] == 1
        assert sample_compute(con, points, two).already_stored == 8  # resumable like one process
        # one lone process measures without the contention: another sample of the same call
        one = ComputeSettings(cluster="ci-cpu", warmup=1, repeats=3)
        assert sample_compute(con, points[:2], one).written == 2
        assert con.execute("SELECT count(DISTINCT sample_id) FROM samples").fetchall() == [(10,)]


def test_workers_run_in_other_processes_and_every_point_is_measured_once() -> None:
    todo = [(p, f"id{i}") for i, p in enumerate(_points(6))]

    def measure(point: GridPoint, sid: str) -> dict[str, object]:
        return {"sid": sid, "pid": os.getpid()}

    out = list(measure_concurrently(todo, measure, 2, nullcontext))
    assert sorted(str(row["sid"]) for _, row in out if isinstance(row, dict)) == [f"id{i}" for i in range(6)]
    pids = {row["pid"] for _, row in out if isinstance(row, dict)}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


def test_a_dying_worker_fails_the_run_with_its_exit_code() -> None:
    todo = [(p, f"id{i}") for i, p in enumerate(_points(3))]

    def measure(point: GridPoint, sid: str) -> dict[str, object]:
        os._exit(3)

    with pytest.raises(SampleError, match="exit code 3"):
        list(measure_concurrently(todo, measure, 2, nullcontext))


def test_a_worker_sample_error_stops_the_run_with_its_message() -> None:
    todo = [(p, f"id{i}") for i, p in enumerate(_points(3))]

    def measure(point: GridPoint, sid: str) -> dict[str, object]:
        raise SampleError("the profiler recorded no event of the timed call")

    with pytest.raises(SampleError, match="recorded no event"):
        list(measure_concurrently(todo, measure, 2, nullcontext))


def test_processes_must_be_positive_and_cpu_only(db_path: Path) -> None:
    with open_database(db_path) as con:
        with pytest.raises(SampleError, match="--processes must be ≥ 1"):
            sample_compute(con, _points(1), ComputeSettings(cluster="c", processes=0))
        assert con.execute("SELECT count(*) FROM samples").fetchall() == [(0,)]


# What the retained allocator changes: a training-like step (a forward and its backward on 1 MiB
# activations, as in the reference workload) pays page faults on fresh pages without it.
_FAULTS = """
import resource, sys, torch
if sys.argv[1] == "retain":
    from tracecal.samplers.allocator import retain_freed_memory
    assert retain_freed_memory() is not None
torch.set_num_threads(1)
x = torch.randn(256, 1024, requires_grad=True)
def step():
    y = torch.nn.functional.gelu(x) * 2.0
    return torch.autograd.grad(y.sum(), [x])
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_retained_memory_spares_the_page_faults_of_fresh_tensors() -> None:
    def faults(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
        return float(out.stdout.strip())

    default, retained = faults("default"), faults("retain")
    # measured here: 384 faults per step (1.5 MiB of fresh pages) with glibc's defaults, 5-10 retained
    assert default > 200, default
    assert retained < 50, retained

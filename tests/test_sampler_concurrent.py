"""Concurrent compute sampling (``--processes``): every point once, in other processes, errors surfaced."""

from __future__ import annotations

import os
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


def test_two_processes_sample_every_point_once_and_record_it(db_path: Path, template_cache: Path) -> None:
    points = _points(8)
    two = ComputeSettings(cluster="ci-cpu", warmup=1, repeats=3, processes=2)
    seen: list[int] = []
    with open_database(db_path, cache_dir=template_cache) as con:
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


def test_processes_must_be_positive_and_cpu_only(db_path: Path, template_cache: Path) -> None:
    with open_database(db_path, cache_dir=template_cache) as con:
        with pytest.raises(SampleError, match="--processes must be ≥ 1"):
            sample_compute(con, _points(1), ComputeSettings(cluster="c", processes=0))
        assert con.execute("SELECT count(*) FROM samples").fetchall() == [(0,)]


def test_passes_spread_the_repeats_and_merge_them_into_one_sample(db_path: Path, template_cache: Path) -> None:
    points = _points(4)
    settings = ComputeSettings(cluster="ci-cpu", warmup=1, repeats=2, passes=3, processes=2)
    totals: set[int] = set()
    with open_database(db_path, cache_dir=template_cache) as con:
        report = sample_compute(con, points, settings, progress=lambda done, total, label: totals.add(total))
        assert (report.planned, report.written) == (4, 4)
        assert totals == {12}  # 3 passes over 4 points
        rows = con.execute("SELECT median_ns, min_ns, repeats, params_json FROM samples").fetchall()
    assert len(rows) == 4
    for median, low, repeats, params in rows:
        assert repeats == 6 and 0 < low <= median
        assert orjson.loads(params)["passes"] == 3


def test_a_point_skipped_in_the_first_pass_is_not_timed_again(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, template_cache: Path
) -> None:
    from tracecal.samplers import cases

    points = _points(2)
    real_build = cases.build
    builds: list[GridPoint] = []

    def build(point: GridPoint, device: str, autograd: bool = True) -> cases.Built:
        builds.append(point)
        if point == points[0]:
            raise RuntimeError("not implemented for this dtype")
        return real_build(point, device, autograd)

    monkeypatch.setattr(cases, "build", build)
    settings = ComputeSettings(cluster="ci-cpu", warmup=0, repeats=1, passes=3)
    with open_database(db_path, cache_dir=template_cache) as con:
        report = sample_compute(con, points, settings)
        assert report.written == 1 and len(report.skipped) == 1
        assert con.execute("SELECT repeats FROM samples").fetchall() == [(3,)]
    assert builds.count(points[0]) == 1 and builds.count(points[1]) == 3
    with (
        open_database(db_path, cache_dir=template_cache) as con,
        pytest.raises(SampleError, match="--passes must be ≥ 1"),
    ):
        sample_compute(con, points[1:], ComputeSettings(cluster="other", passes=0))

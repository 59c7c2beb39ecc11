"""The compute sampler on CPU: every family of the CI grid, stored rows, resume, shards, skips."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tracecal.errors import SampleError
from tracecal.samplers import cases
from tracecal.samplers.compute import ComputeSettings, sample_compute
from tracecal.samplers.grid import GridPoint, load_grid, shard
from tracecal.sql.connection import open_database

FAST = ComputeSettings(cluster="ci-cpu", warmup=1, repeats=3)


def _gemm_points() -> list[GridPoint]:
    return [p for p in load_grid("ci").points if p.family == "gemm"]


@pytest.mark.slow
def test_ci_grid_samples_every_family_and_direction_and_resumes(db_path: Path, template_cache: Path) -> None:
    import torch

    grid = load_grid("ci")
    settings = ComputeSettings(cluster="ci-cpu", warmup=1, repeats=3, source_file=grid.source)
    with open_database(db_path, cache_dir=template_cache) as con:
        report = sample_compute(con, grid.points, settings)
        assert (report.planned, report.already_stored, report.skipped) == (len(grid.points), 0, [])
        assert report.written == len(grid.points)
        rows = con.execute(
            "SELECT family, op, direction, median_ns, min_ns, iqr_ns, repeats, dtype, source, source_file, "
            "torch_version, cuda_version, nccl_version, device_name, host, sampled_at, params_json FROM samples"
        ).fetchall()
        expected = Counter((p.family, p.op, p.direction) for p in grid.points)
        assert Counter((r[0], r[1], r[2]) for r in rows) == expected
        families = {(r[0], r[2]) for r in rows}
        for family in cases.FAMILIES:
            assert (family, "fwd") in families
            if family != "optimizer":  # an optimizer step has no backward
                assert (family, "bwd") in families
        for r in rows:
            median, low, iqr, n = r[3:7]
            assert median > 0 and 0 < low <= median and iqr >= 0 and n == 3
            assert r[7] == "float32" and r[8] == "sampler" and r[9] == grid.source
            assert r[10] == torch.__version__ and r[11] is None and r[12] is None
            assert r[13] and r[14] and r[15] is not None
        # the forward shape goes with both directions: same shape columns for fwd and bwd of a point
        shapes = con.execute(
            "SELECT direction, m, n, k, flops FROM samples WHERE op = 'aten::linear' ORDER BY m, direction"
        ).fetchall()
        assert [s[1:] for s in shapes[0::2]] == [s[1:] for s in shapes[1::2]]

        again = sample_compute(con, grid.points, settings)
        assert (again.already_stored, again.written) == (len(grid.points), 0)
        assert con.execute("SELECT count(*) FROM samples").fetchall() == [(len(grid.points),)]


def test_shards_together_write_the_whole_grid_once(db_path: Path, template_cache: Path) -> None:
    points = _gemm_points()[:6]
    with open_database(db_path, cache_dir=template_cache) as con:
        written = [sample_compute(con, shard(points, 3, k), FAST).written for k in (1, 2, 3)]
        assert written == [2, 2, 2]
        assert sample_compute(con, points, FAST).written == 0
        assert con.execute("SELECT count(DISTINCT sample_id) FROM samples").fetchall() == [(6,)]


def test_an_interrupted_run_keeps_what_it_measured_and_the_next_run_continues(
    db_path: Path, template_cache: Path
) -> None:
    points = _gemm_points()[:5]

    def stop_after_two(done: int, total: int, label: str) -> None:
        if done == 2:
            raise KeyboardInterrupt

    with open_database(db_path, cache_dir=template_cache) as con:
        with pytest.raises(KeyboardInterrupt):
            sample_compute(con, points, FAST, progress=stop_after_two)
        assert con.execute("SELECT count(*) FROM samples").fetchall() == [(2,)]
        report = sample_compute(con, points, FAST)
        assert (report.already_stored, report.written) == (2, 3)


def test_points_torch_cannot_run_are_skipped_with_its_reason(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, template_cache: Path
) -> None:
    points = _gemm_points()[:2]
    real_build = cases.build

    def build(point: GridPoint, device: str, autograd: bool = True) -> cases.Built:
        if point == points[0]:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'\nmore detail")
        return real_build(point, device, autograd)

    monkeypatch.setattr(cases, "build", build)
    with open_database(db_path, cache_dir=template_cache) as con:
        report = sample_compute(con, points, FAST)
        assert report.written == 1
        assert report.skipped_reasons() == {"RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'": 1}
        assert con.execute("SELECT count(*) FROM samples").fetchall() == [(1,)]


def test_a_malformed_point_fails_before_anything_is_timed_or_written(db_path: Path, template_cache: Path) -> None:
    good = _gemm_points()[:1]
    bad = GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", 4), ("n", 4)))
    no_bwd = GridPoint("elementwise", "aten::add", "bwd", "float32", (("tokens", 4), ("hidden", 4)))
    with open_database(db_path, cache_dir=template_cache) as con:
        with pytest.raises(SampleError, match="missing: k"):
            sample_compute(con, [*good, bad], FAST)
        with pytest.raises(SampleError, match="aten::add has no backward"):
            sample_compute(con, [*good, no_bwd], FAST)
        assert con.execute("SELECT count(*) FROM samples").fetchall() == [(0,)]


def test_cpu_threads_are_restored_and_recorded(db_path: Path, template_cache: Path) -> None:
    import torch

    before = torch.get_num_threads()
    with open_database(db_path, cache_dir=template_cache) as con:
        sample_compute(con, _gemm_points()[:1], FAST)
        params = con.execute("SELECT params_json FROM samples").fetchall()[0][0]
    assert torch.get_num_threads() == before
    assert '"threads":1' in params and '"input_dims":[[32,32],[32,64]]' in params


def test_the_same_point_on_another_cluster_is_another_sample(db_path: Path, template_cache: Path) -> None:
    point = _gemm_points()[:1]
    with open_database(db_path, cache_dir=template_cache) as con:
        sample_compute(con, point, FAST)
        other = ComputeSettings(cluster="other", warmup=0, repeats=1)
        assert sample_compute(con, point, other).written == 1
        assert con.execute("SELECT iqr_ns FROM samples WHERE cluster = 'other'").fetchall() == [(None,)]


def test_inference_forward_samples_are_distinct_from_training_ones(db_path: Path, template_cache: Path) -> None:
    point = _gemm_points()[:1]
    assert point[0].direction == "fwd"
    with open_database(db_path, cache_dir=template_cache) as con:
        sample_compute(con, point, FAST)
        inference = ComputeSettings(cluster="ci-cpu", warmup=1, repeats=3, autograd=False)
        assert sample_compute(con, point, inference).written == 1  # not "already stored"
        flags = sorted(r[0] for r in con.execute("SELECT params_json FROM samples").fetchall())
    assert ['"autograd":false' in f for f in flags].count(True) == 1
    assert ['"autograd":true' in f for f in flags].count(True) == 1


def test_the_timing_method_is_recorded_and_profiler_samples_are_distinct(db_path: Path, template_cache: Path) -> None:
    point = _gemm_points()[:1]
    with open_database(db_path, cache_dir=template_cache) as con:
        sample_compute(con, point, FAST)
        profiled = ComputeSettings(cluster="ci-cpu", warmup=1, repeats=3, timing="profiler")
        assert sample_compute(con, point, profiled).written == 1  # not "already stored"
        assert sample_compute(con, point, profiled).already_stored == 1
        rows = con.execute("SELECT params_json, median_ns, repeats FROM samples ORDER BY params_json").fetchall()
    assert ['"timing":"perf_counter"' in r[0] for r in rows].count(True) == 1
    assert ['"timing":"profiler"' in r[0] for r in rows].count(True) == 1
    assert all(r[1] > 0 and r[2] == 3 for r in rows)


def test_a_timing_method_the_device_cannot_use_fails_before_anything_is_written(
    db_path: Path, template_cache: Path
) -> None:
    with open_database(db_path, cache_dir=template_cache) as con:
        with pytest.raises(SampleError, match="--timing cuda_events cannot time on cpu"):
            sample_compute(con, _gemm_points()[:1], ComputeSettings(cluster="c", timing="cuda_events"))
        assert con.execute("SELECT count(*) FROM samples").fetchall() == [(0,)]


def test_every_sampler_builds_its_rows_with_one_builder() -> None:
    """``sample_row`` gives every ``samples`` column, the repeats' statistics and where the sample was
    taken; a column the table does not have is refused instead of silently dropped on write."""
    from tracecal.samplers.rows import SOURCE, sample_row
    from tracecal.samplers.timing import SamplerEnv
    from tracecal.schema import SAMPLES

    env = SamplerEnv("cpu x", "host1", "2.13.0", None, None)
    identity = dict(sample_id="s1", cluster="c", family="optimizer", op="adam", direction="fwd", source_file="g")
    columns = {"params": 10, "timing": "wall"}
    row = sample_row(env, **identity, durations_ns=[4.0, 1.0, 2.0, 3.0], params={"warmup": 1}, columns=columns)
    assert list(row) == SAMPLES.column_names
    assert (row["median_ns"], row["min_ns"], row["repeats"], row["params"], row["m"]) == (2.5, 1.0, 4, 10, None)
    assert (row["device_name"], row["host"], row["torch_version"]) == ("cpu x", "host1", "2.13.0")
    assert (row["source"], row["params_json"], row["timing"]) == (SOURCE, '{"warmup":1}', "wall")
    with pytest.raises(KeyError, match="not samples columns: rows"):
        sample_row(env, **identity, durations_ns=[1.0], params={}, columns={"rows": 3})

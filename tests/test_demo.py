"""`tracecal demo` end to end on this machine (slow: trains the reference workload)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracecal.cli.main import app
from tracecal.samplers.grid import GridPoint
from tracecal.samplers.plan import neighbourhood
from tracecal.sql.connection import open_database


def test_neighbourhood_is_factorial_and_deduplicated() -> None:
    mm = GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", 256), ("n", 1024), ("k", 256)))
    gelu = GridPoint("elementwise", "aten::gelu", "fwd", "float32", (("tokens", 256), ("hidden", 1024)))
    pts = neighbourhood([mm, mm, gelu])
    assert pts[0] == mm  # the traced shape itself comes first
    assert sum(p.op == "aten::mm" for p in pts) == 27  # 3 dims x {0.5, 1, 2}
    assert sum(p.op == "aten::gelu" for p in pts) == 25  # 2 dims x {0.5, 0.75, 1, 1.5, 2}
    assert GridPoint("gemm", "aten::mm", "fwd", "float32", (("m", 128), ("n", 2048), ("k", 512))) in pts
    assert len(set(pts)) == len(pts)


@pytest.mark.slow
def test_demo_runs_the_whole_loop(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.output
    for stage in ("[1/5] workload", "[2/5] ingest", "[3/5] sample", "[4/5] calibrate", "[5/5] predict"):
        assert stage in out
    assert "measured-mode replay reproduces every rank within 0.000 %" in out
    # CPU-only ranks keep every measured gap as a lag: nothing is absorbed, the replays agree
    assert "dependency replay (no absorbed slack) within 0.000 % on every rank" in out
    assert "| overall |" in out
    assert "overall iteration error (slowest rank" in out and "dependency replay):" in out
    assert (tmp_path / "demo.duckdb").stat().st_size > 0
    # sampled like the workload ran: one process per rank, repeats spread over passes, and the
    # optimizer's per-parameter elementwise calls as themselves
    assert "2 processes at once" in out
    with open_database(tmp_path / "demo.duckdb", read_only=True) as con:
        how = con.execute(
            "SELECT DISTINCT json_extract(params_json, '$.processes')::INT, "
            "json_extract(params_json, '$.passes')::INT, repeats FROM samples"
        ).fetchall()
        ops = {r[0] for r in con.execute("SELECT DISTINCT op FROM samples").fetchall()}
        # the workload's traces drop scalar lists but keep the scalars decode needs: every attention
        # call knows it is causal, so the sampler times it rather than leaving it unmapped
        causal = con.execute("SELECT DISTINCT causal FROM operators WHERE family = 'attention'").fetchall()
        sdpa = {r[0] for r in con.execute("SELECT op FROM samples WHERE family = 'attention'").fetchall()}
    assert how == [(2, 3, 6)]
    assert causal == [(True,)] and sdpa
    assert {"aten::sqrt", "aten::lerp_", "aten::addcdiv_", "aten::addcmul_"} <= ops
    assert (tmp_path / "figures" / "component_proportions.png").exists()
    assert list((tmp_path / "figures").glob("timeline_rank*.png"))
    # its duration is a measured figure (README), not a timed test: the demo prints wall and CPU time
    assert "s wall," in out and "s CPU" in out


def test_the_device_decides_the_layout_and_a_missing_gpu_is_one_clear_line() -> None:
    from tracecal.cli.demo import resolve_layout
    from tracecal.errors import WorkloadError

    assert resolve_layout("cpu", None, 1, 1, gpus=0) == 2  # PP2 on CPU
    assert resolve_layout("cuda", None, 1, 1, gpus=1) == 1  # one rank on one GPU
    with pytest.raises(WorkloadError, match="no CUDA device"):
        resolve_layout("cuda", None, 1, 1, gpus=0)
    with pytest.raises(WorkloadError, match="2 ranks but 1 GPU"):
        resolve_layout("cuda", 2, 1, 1, gpus=1)
    with pytest.raises(WorkloadError, match="--device 'tpu'"):
        resolve_layout("tpu", None, 1, 1, gpus=0)


def test_gpu_samples_are_one_process_timed_with_cuda_events() -> None:
    from tracecal.samplers.plan import run_settings
    from tracecal.samplers.timing import default_timing

    gpu = run_settings("local", "cuda", "run", repeats=5, passes=3, processes=4)
    assert (gpu.device, gpu.processes, gpu.threads) == ("cuda", 1, None)
    assert default_timing(gpu.device) == "cuda_events" and gpu.timing is None
    cpu = run_settings("local", "cpu", "run", repeats=2, passes=3, processes=2)
    assert (cpu.device, cpu.processes, cpu.threads, cpu.timing) == ("cpu", 2, 1, None)


def test_demo_on_cuda_without_a_gpu_says_so() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CUDA path runs (benchmarks/gpu_check.sh)")
    result = CliRunner().invoke(app, ["demo", "--device", "cuda"])
    assert result.exit_code == 2
    assert "no CUDA device" in result.output


@pytest.mark.slow
def test_gpu_demo_script_runs_its_cpu_path(tmp_path: Path) -> None:
    """benchmarks/gpu_demo.py with --device cpu: the same code as on a GPU, one rank, small settings."""
    import importlib.util

    import polars as pl

    spec = importlib.util.spec_from_file_location("gpu_demo", Path(__file__).parents[1] / "benchmarks" / "gpu_demo.py")
    assert spec is not None and spec.loader is not None
    gpu_demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_demo)
    argv = ["--device", "cpu", "--out", str(tmp_path), "--steps", "4", "--repeats", "1", "--passes", "1"]
    assert gpu_demo.main(argv) == 0
    comps = pl.read_csv(tmp_path / "components.csv")
    kinds = set(comps.select("mode", "replay").unique().iter_rows())
    assert {("measured", "fitted"), ("measured", "dependency"), ("predicted", "dependency")} <= kinds
    assert comps["rank"].unique().to_list() == [0]
    assert (tmp_path / "components.md").read_text().startswith("| rank | component |")
    summary = (tmp_path / "summary.txt").read_text()
    assert "device: cpu" in summary and "predicted mode, dependency replay: overall error" in summary

"""`tracecal demo` end to end on this machine (slow: trains the reference workload)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import SHARED_DATA
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
def test_demo_runs_the_whole_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's `tracecal demo`, run once (it trains, samples and calibrates: the suite's longest
    test) through benchmarks/gpu_demo.py with --device cpu, the same code as on a GPU. The script
    spells out the layout and settings, so it is given the demo's own defaults on a CPU: what the
    demo prints and stores, then the tables and summary the script writes from its database."""
    import importlib.util

    import polars as pl
    from typer.main import get_command

    defaults = {p.name: p.default for p in get_command(app).commands["demo"].params}
    assert [defaults[k] for k in ("steps", "repeats", "passes", "tp", "dp")] == [10, 2, 3, 1, 1]  # pp: 2 on a CPU
    spec = importlib.util.spec_from_file_location("gpu_demo", Path(__file__).parents[1] / "benchmarks" / "gpu_demo.py")
    assert spec is not None and spec.loader is not None
    gpu_demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_demo)
    argv = ["--device", "cpu", "--out", str(tmp_path), "--pp", "2", "--steps", "10", "--repeats", "2", "--passes", "3"]
    assert gpu_demo.main(argv) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    work = tmp_path / "demo"
    for stage in ("[1/5] workload", "[2/5] ingest", "[3/5] sample", "[4/5] calibrate", "[5/5] predict"):
        assert stage in out
    assert "measured-mode replay reproduces every rank within 0.000 %" in out
    # CPU-only ranks keep every measured gap as a lag: nothing is absorbed, the replays agree
    assert "dependency replay (no absorbed slack) within 0.000 % on every rank" in out
    assert "| overall |" in out
    assert "overall iteration error (slowest rank" in out and "dependency replay):" in out
    assert (work / "demo.duckdb").stat().st_size > 0
    # sampled like the workload ran: one process per rank, repeats spread over passes, and the
    # optimizer's per-parameter elementwise calls as themselves
    assert "2 processes at once" in out
    with open_database(work / "demo.duckdb", read_only=True) as con:
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
    assert (work / "figures" / "component_proportions.png").exists()
    assert list((work / "figures").glob("timeline_rank*.png"))
    # its duration is a measured figure (README), not a timed test: the demo prints wall and CPU time
    assert "s wall," in out and "s CPU" in out
    # the script's tables: both measured-mode replays and the predicted dependency replay, every rank
    comps = pl.read_csv(tmp_path / "components.csv")
    kinds = set(comps.select("mode", "replay").unique().iter_rows())
    assert {("measured", "fitted"), ("measured", "dependency"), ("predicted", "dependency")} <= kinds
    assert sorted(comps["rank"].unique().to_list()) == [0, 1]
    assert (tmp_path / "components.md").read_text().startswith("| rank | component |")
    summary = (tmp_path / "summary.txt").read_text()
    assert "device: cpu" in summary and "predicted mode, dependency replay: overall error" in summary
    assert "GPU busy: no GPU activity (a CPU run)" in summary


def test_the_device_decides_the_layout_and_a_missing_gpu_is_one_clear_line() -> None:
    from tracecal.api.demo import resolve_layout
    from tracecal.errors import WorkloadError

    assert resolve_layout("cpu", None, 1, 1, gpus=0) == 2  # PP2 on CPU
    assert resolve_layout("cuda", None, 1, 1, gpus=1) == 1  # one rank on one GPU
    with pytest.raises(WorkloadError, match="no CUDA device"):
        resolve_layout("cuda", None, 1, 1, gpus=0)
    with pytest.raises(WorkloadError, match="2 ranks but 1 GPU"):
        resolve_layout("cuda", 2, 1, 1, gpus=1)
    with pytest.raises(WorkloadError, match="--device 'tpu'"):
        resolve_layout("tpu", None, 1, 1, gpus=0)


def test_gpu_samples_are_one_process_timed_by_their_kernels() -> None:
    from tracecal.samplers.plan import run_settings
    from tracecal.samplers.timing import default_timing

    gpu = run_settings("local", "cuda", "run", repeats=5, passes=3, processes=4)
    assert (gpu.device, gpu.processes, gpu.threads) == ("cuda", 1, None)
    assert default_timing(gpu.device) == "cuda_burst" and gpu.timing is None
    cpu = run_settings("local", "cpu", "run", repeats=2, passes=3, processes=2)
    assert (cpu.device, cpu.processes, cpu.threads, cpu.timing) == ("cpu", 2, 1, None)


def test_demo_on_cuda_without_a_gpu_says_so() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CUDA path runs (benchmarks/gpu_check.sh)")
    result = CliRunner().invoke(app, ["demo", "--device", "cuda"])
    assert result.exit_code == 2
    assert "no CUDA device" in result.output


H200 = SHARED_DATA / "gpu" / "h200"


@pytest.fixture(scope="module")
def h200_db(ingested_copy: Callable[..., Path]) -> Path:
    """Both shared H200 runs ingested: the GPU-bound GPT and the demo's tiny default."""
    return ingested_copy(H200 / "gpt_h2048_l8_bf16", H200 / "demo_tiny", cluster="h200")


def test_gpu_busy_share_tells_the_cpu_bound_demo_from_the_gpu_bound_gpt(h200_db: Path) -> None:
    from tracecal.sql.gpu_busy import gpu_busy, is_gpu_bound

    with open_database(h200_db, read_only=True) as con:
        (tiny,) = gpu_busy(con, "demo_tiny")
        (big,) = gpu_busy(con, "gpt_h2048_l8_bf16")
        assert gpu_busy(con, "not_ingested") == []
    # the H200 was busy 4.4 ms of the tiny model's 55 ms iteration
    assert (tiny.rank, tiny.iteration) == (0, 2)
    assert tiny.busy_ns == pytest.approx(4.41e6, rel=0.01) and tiny.iteration_ns == pytest.approx(54.86e6, rel=0.01)
    assert tiny.busy_share == pytest.approx(0.080, abs=0.002) and not is_gpu_bound(tiny.busy_share)
    assert big.busy_share == pytest.approx(0.961, abs=0.002) and is_gpu_bound(big.busy_share)
    assert big.busy_ns <= big.iteration_ns


def test_the_iteration_is_the_headline_only_when_the_gpu_was_busy() -> None:
    from tracecal.api.demo import Headline, headline_score
    from tracecal.cli.demo import headline_lines

    assert [headline_score(s) for s in (0.961, None, 0.080)] == ["iteration", "iteration", "components"]  # None: CPU

    def headline(busy_share: float | None, error_pct: float) -> Headline:
        comps = {"compute_fwd": 42.0, "compute_bwd": 160.4, "optimizer": None}
        return Headline(
            score=headline_score(busy_share), rank=0, replay="dependency", iteration_error_pct=error_pct,
            measured_ms=1.0, predicted_ms=1.0, fitted_error_pct=None, model_share=1.0, busy_share=busy_share,
            components=comps,
        )  # fmt: skip

    busy = headline_lines(headline(0.961, 7.74))
    assert busy == ["overall iteration error (slowest rank 0, dependency replay): +7.74 %"]
    first, second = headline_lines(headline(0.080, 0.02))
    assert (
        first == "compute components (slowest rank 0, dependency replay): compute_fwd +42.00 %, compute_bwd +160.40 %"
    )
    assert "busy 8.0 % of the iteration (< 85 %)" in second and "overall iteration error" in second


def test_the_gpu_demo_model_is_sized_to_the_device_memory() -> None:
    import json

    from tracecal.errors import WorkloadError
    from tracecal.workload import WorkloadConfig
    from tracecal.workload.sizing import MEMORY_SHARE, gpu_demo_config, parameter_count, training_bytes

    gib = 2**30
    # the parameter count the estimate starts from is the model's own, on both H200 runs
    for run in ("demo_tiny", "gpt_h2048_l8_bf16"):
        facts = json.loads((H200 / run / "run.json").read_text())
        assert parameter_count(WorkloadConfig.from_dict(facts)) == facts["ranks"][0]["parameters"]
    h200, h100, small = gpu_demo_config(141 * gib), gpu_demo_config(80 * gib), gpu_demo_config(16 * gib)
    # H100 and H200 train the configuration measured GPU-bound on the H200 (96 % busy)
    for cfg in (h200, h100):
        assert (cfg.hidden, cfg.layers, cfg.heads, cfg.seq, cfg.vocab, cfg.dtype) == (
            2048,
            8,
            16,
            1024,
            32000,
            "bfloat16",
        )
        assert (cfg.micro_batches, cfg.micro_batch_size, cfg.model, cfg.device) == (4, 4, "gpt_h2048_l8_bf16", "cuda")
    assert small.hidden < 2048 and training_bytes(small) <= MEMORY_SHARE * 16 * gib < training_bytes(h200)
    assert gpu_demo_config(2 * gib).model == "gpt_tiny"  # nothing bigger fits: the tiny default
    # layouts: layers rounded up to whole stages; heads that do not split over TP fail in one line
    assert gpu_demo_config(80 * gib, pp=3).layers == 9 and gpu_demo_config(80 * gib, pp=2, tp=2).world_size == 4
    with pytest.raises(WorkloadError, match="--heads 16 is not divisible by --tp 3"):
        gpu_demo_config(80 * gib, tp=3)

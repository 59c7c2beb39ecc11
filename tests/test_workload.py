"""The reference workload's pure parts: configuration checks, Megatron layout, data, weights, buckets.

These run in-process without torch.distributed; ``test_workload_runs.py`` launches real ranks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tracecal.cli.main import app
from tracecal.errors import WorkloadError
from tracecal.workload import WorkloadConfig, run_local
from tracecal.workload.launch import ERROR_FILE_ENV, argument_parser, config_args, config_from_args
from tracecal.workload.launch import main as launch_main
from tracecal.workload.model import GPTStage, full_tensor, micro_batches, synthetic_batch
from tracecal.workload.parallel import ParallelState
from tracecal.workload.train import plan_buckets


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pp": 3, "layers": 4}, "--layers 4 is not divisible by --pp 3"),
        ({"tp": 3, "heads": 4}, "--heads 4 is not divisible by --tp 3"),
        ({"hidden": 100, "heads": 3}, "--hidden 100 is not divisible by --heads 3"),
        ({"steps": 2}, "leaves no profiled step"),
        ({"dp": 0}, "--dp must be at least 1"),
        ({"dtype": "float8"}, "--dtype 'float8' is not supported"),
        ({"threads": -1}, "--threads must be 0"),
        ({"tp": 2, "vocab": 101, "vocab_parallel": True}, "--vocab 101 is not divisible by --tp 2"),
    ],
)
def test_inconsistent_configs_are_rejected_with_the_values(changes: dict, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        WorkloadConfig(**changes).validate()


def test_megatron_layout_tp_fastest_then_dp_then_pp() -> None:
    cfg = WorkloadConfig(pp=2, tp=2, dp=2, layers=4)
    assert cfg.world_size == 8
    assert cfg.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert cfg.dp_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert cfg.pp_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert cfg.coords(5) == (1, 0, 1)  # 5 = 1·(2·2) + 0·2 + 1
    assert all(cfg.rank_of(*cfg.coords(r)) == r for r in range(8))
    with pytest.raises(WorkloadError, match="outside a world of 8"):
        cfg.coords(8)


def test_expected_counts_per_step() -> None:
    cfg = WorkloadConfig(pp=3, tp=2, dp=1, layers=6, micro_batches=5)
    # first and last stage talk to one neighbour, the middle stage to two
    assert cfg.expected_p2p_per_step(0) == {"send": 5, "recv": 5}
    assert cfg.expected_p2p_per_step(2) == {"send": 10, "recv": 10}
    assert cfg.expected_p2p_per_step(5) == {"send": 5, "recv": 5}
    # 2 layers per stage x 5 micro-batches x (2 forward + 2 backward)
    assert cfg.expected_tp_all_reduces_per_step() == 40
    assert WorkloadConfig(tp=1).expected_tp_all_reduces_per_step() == 0
    # vocab-parallel adds the embedding's all-reduce on the first stage and, on the last, the
    # cross-entropy's three plus the LM head input's gradient
    vp = WorkloadConfig(pp=3, tp=2, layers=6, micro_batches=5, vocab_parallel=True)
    assert [vp.expected_tp_all_reduces_per_step(r) for r in (0, 1, 2, 3, 4, 5)] == [45, 45, 40, 40, 60, 60]
    assert WorkloadConfig(steps=6, profile_wait=1, profile_warmup=2).profiled_steps == [3, 4, 5]


def test_rank_command_line_round_trips_the_config() -> None:
    cfg = WorkloadConfig(
        pp=4, tp=2, dp=3, layers=8, lr=3e-4, dtype="bfloat16", model="gpt_x", timeout_s=12.5, threads=3,
        vocab_parallel=True,
    )  # fmt: skip
    ns = argument_parser().parse_args([*config_args(cfg), "--out", "somewhere"])
    assert config_from_args(ns) == cfg
    assert ns.out == Path("somewhere")


def test_batches_do_not_depend_on_the_data_parallel_layout() -> None:
    ref = WorkloadConfig(pp=1, dp=1, micro_batches=4, micro_batch_size=2, seq=16, vocab=97)
    dp2 = WorkloadConfig(pp=1, dp=2, micro_batches=2, micro_batch_size=2, seq=16, vocab=97)
    single = micro_batches(ref, 0, step=3)
    split = micro_batches(dp2, 0, step=3) + micro_batches(dp2, 1, step=3)
    assert len(single) == len(split) == 4
    for (x1, y1), (x2, y2) in zip(single, split, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    inputs, targets = synthetic_batch(ref, 0)
    assert inputs.shape == (8, 16) and inputs.dtype == torch.int64
    assert torch.equal(targets, (31 * inputs + 7) % 97)  # the learnable recurrence
    assert not torch.equal(synthetic_batch(ref, 1)[0], inputs)  # a new batch every step


def _state(cfg: WorkloadConfig, pp_rank: int, tp_rank: int = 0) -> ParallelState:
    # tp_group is only used when tp > 1 in forward; building shards needs no process group.
    return ParallelState(cfg, 0, 0, 1, pp_rank, 0, tp_rank, None, None, None, torch.device("cpu"), "gloo")


def test_weights_are_the_same_whichever_stage_or_shard_holds_them() -> None:
    single = WorkloadConfig(pp=1, tp=1, layers=4, hidden=32, heads=4, seq=8, vocab=64)
    split = WorkloadConfig(pp=2, tp=2, layers=4, hidden=32, heads=4, seq=8, vocab=64)
    whole = GPTStage(single, _state(single, 0))
    stage1 = [GPTStage(split, _state(split, 1, t)) for t in (0, 1)]
    # global layer 2 is stage 1's first block; out-projection is row-parallel: shards are column halves
    full_out = whole.blocks[2].attn_out.weight.detach()
    assert torch.equal(torch.cat([s.blocks[0].attn_out.weight.detach() for s in stage1], dim=1), full_out)
    # QKV is column-parallel by heads: each shard holds its half of q, of k and of v
    q_full = whole.blocks[2].qkv.weight.detach()[:32]
    q_halves = [s.blocks[0].qkv.weight.detach()[:16] for s in stage1]
    assert torch.equal(torch.cat(q_halves), q_full)
    assert torch.equal(stage1[0].head.weight, whole.head.weight)
    assert not hasattr(stage1[0], "embed") and hasattr(whole, "embed")
    assert torch.equal(full_tensor(1, "x", (3,), 1.0), full_tensor(1, "x", (3,), 1.0))
    assert not torch.equal(full_tensor(1, "x", (3,), 1.0), full_tensor(2, "x", (3,), 1.0))


def test_buckets_respect_the_cap_and_cover_every_parameter_once() -> None:
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (10, 300, 20, 20, 5)]  # float32: 4 bytes each
    buckets = plan_buckets(params, bucket_bytes=200)
    assert [[p.numel() for p in b] for b in buckets] == [[5, 20, 20], [300], [10]]
    assert sorted(id(p) for b in buckets for p in b) == sorted(id(p) for p in params)
    assert len(plan_buckets(params, bucket_bytes=1 << 30)) == 1


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, tracecal.workload, tracecal.cli.main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_existing_run_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(WorkloadError, match="already holds a run"):
        run_local(WorkloadConfig(), tmp_path)
    assert (tmp_path / "run.json").read_text() == "{}"


def test_a_failing_rank_writes_its_error_to_the_error_file_and_nothing_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One rank as ``run_local`` starts it (RANK and the error file in its environment): its error goes
    to the file as JSON, where ``run_local`` reads it, and stderr stays empty."""
    error_file = tmp_path / "rank0.error.json"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv(ERROR_FILE_ENV, str(error_file))
    assert launch_main(["--vocab", "1", "--out", str(tmp_path / "run")]) == 2
    report = json.loads(error_file.read_text())
    assert (report["type"], report["message"]) == ("WorkloadError", "--vocab must be at least 2 (got 1)")
    assert isinstance(report["time"], float)
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "run").exists()


def test_cli_reports_an_inconsistent_config_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["workload", "run", "--pp", "3", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "--layers 4 is not divisible by --pp 3" in result.output
    assert not (tmp_path / "r").exists()


def test_single_stage_schedule_accumulates_the_mean_loss_gradient() -> None:
    from torch.nn import functional as F

    from tracecal.workload.schedule import run_1f1b
    from tracecal.workload.train import autocast_for

    cfg = WorkloadConfig(pp=1, layers=1, hidden=32, heads=2, seq=8, vocab=64, micro_batches=3)
    batches = micro_batches(cfg, 0, step=0)
    scheduled = GPTStage(cfg, _state(cfg, 0))
    losses = run_1f1b(scheduled, _state(cfg, 0), batches)
    plain = GPTStage(cfg, _state(cfg, 0))
    expected = [F.cross_entropy(plain(x).flatten(0, 1), y.flatten()) for x, y in batches]
    (sum(expected) / len(expected)).backward()
    assert [float(v) for v in losses] == pytest.approx([float(v.detach()) for v in expected], rel=1e-6)
    for (name, p), q in zip(scheduled.named_parameters(), plain.parameters(), strict=True):
        assert p.grad is not None and torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7), name
    # bfloat16 runs the forward under autocast: close to float32, but not the same numbers
    bf16 = replace(cfg, dtype="bfloat16")
    low = run_1f1b(GPTStage(bf16, _state(bf16, 0)), _state(bf16, 0), batches, autocast_for(bf16, torch.device("cpu")))
    assert [float(v) for v in low] == pytest.approx([float(v) for v in losses], rel=2e-2)
    assert [float(v) for v in low] != [float(v) for v in losses]


def test_vocab_parallel_cross_entropy_is_cross_entropy_with_its_gradient() -> None:
    import torch.distributed as dist
    from torch.nn import functional as F

    from tracecal.workload.launch import free_port
    from tracecal.workload.parallel import vocab_parallel_cross_entropy

    # A one-rank group: the all-reduces are identities, so one shard holding the whole vocabulary
    # must give exactly cross-entropy and its gradient (sharding is covered by the TP runs).
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(0), requires_grad=True)
        target = torch.tensor([0, 3, 10, 5, 5, 7])
        ours = vocab_parallel_cross_entropy(logits, target, dist.group.WORLD, 0).mean()
        (grad_ours,) = torch.autograd.grad(ours, logits)
        theirs = F.cross_entropy(logits, target)
        (grad_theirs,) = torch.autograd.grad(theirs, logits)
        assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-6)
        assert torch.allclose(grad_ours, grad_theirs, atol=1e-7)
    finally:
        dist.destroy_process_group()

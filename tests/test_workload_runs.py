"""Real runs of the reference workload (local gloo ranks on CPU), checked from their traces.

The session's tiny runs — PP2, TP2, DP2 and PP2×TP2 (``tiny_layouts`` in conftest) — are trained
once; each test reads the rank traces and asserts what the parallelism must have put there:
send/recv per micro-batch, TP all-reduces per layer per micro-batch, one DP all-reduce per gradient
bucket per step, the profiled iterations, distributedInfo, and losses equal to those of the same model
trained in one process without torch.distributed (``reference_losses``).
"""

from __future__ import annotations

import functools
import gzip
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import TinyLayoutRuns, workload_run_args
from tracecal.cli.main import app
from tracecal.errors import WorkloadError
from tracecal.workload import TINY, TINY_LAYOUTS, WorkloadConfig, run_local
from tracecal.workload.model import GPTStage
from tracecal.workload.parallel import ParallelState
from tracecal.workload.train import FAULT_ENV, plan_buckets

pytestmark = pytest.mark.slow

LAYOUTS = TINY_LAYOUTS


@pytest.fixture(scope="module")
def runs(tiny_layouts: TinyLayoutRuns) -> dict[str, Path]:
    """The runs of LAYOUTS, shared with the other tests of the session (PP2 went through `tracecal workload run`)."""
    return {name: tiny_layouts(name) for name in LAYOUTS}


@functools.lru_cache(maxsize=64)
def load(run: Path, rank: int) -> dict[str, Any]:
    """A rank's trace, parsed once per test session (tests only read it)."""
    with gzip.open(run / f"rank{rank}.pt.trace.json.gz", "rt") as f:
        return json.load(f)


SCOPES = ("ProfilerStep#", "## ", "_exec_", "_ReduceFrom", "_CopyTo", "_VocabParallel", "Optimizer.")
"""Names of the enclosing events the tests look at (restricting parents to them keeps scans fast)."""


def scopes_of(trace: dict[str, Any], name_prefix: str) -> list[tuple[str, list[str]]]:
    """Each complete event whose name starts with ``name_prefix``, with the names of the scope events
    (``SCOPES``) enclosing it on the same thread, outermost first."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    scopes = [e for e in events if e["name"].startswith(SCOPES)]
    out = []
    for e in events:
        if not e["name"].startswith(name_prefix):
            continue
        start, end = e["ts"], e["ts"] + e["dur"]
        parents = [
            p for p in scopes if p is not e and p["tid"] == e["tid"] and p["ts"] <= start and end <= p["ts"] + p["dur"]
        ]
        parents.sort(key=lambda p: (p["ts"], -p["dur"]))
        out.append((e["name"], [p["name"] for p in parents]))
    return out


def count(trace: dict[str, Any], name: str, inside: str) -> int:
    return sum(1 for _, parents in scopes_of(trace, name) if any(p.startswith(inside) for p in parents))


def test_every_rank_writes_a_gzip_trace_with_distributed_info(runs: dict[str, Path]) -> None:
    for name, cfg in LAYOUTS.items():
        run = runs[name]
        assert sorted(p.name for p in run.iterdir()) == sorted(
            [f"rank{r}.pt.trace.json.gz" for r in range(cfg.world_size)] + ["run.json"]
        )
        for rank in range(cfg.world_size):
            info = load(run, rank)["distributedInfo"]
            assert (info["rank"], info["world_size"], info["backend"]) == (rank, cfg.world_size, "gloo")
            groups = {g["pg_desc"]: g["ranks"] for g in info["pg_config"]}
            assert groups["tp"] in cfg.tp_groups() and rank in groups["tp"]
            assert groups["dp"] in cfg.dp_groups() and rank in groups["dp"]
            assert groups["pp"] in cfg.pp_groups() and rank in groups["pp"]


def test_the_profiled_iterations_are_in_every_trace(runs: dict[str, Path]) -> None:
    for name, cfg in LAYOUTS.items():
        for rank in range(cfg.world_size):
            trace = load(runs[name], rank)
            steps = Counter(e["name"] for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#"))
            assert (
                steps
                == Counter(f"ProfilerStep#{s}" for s in cfg.profiled_steps)
                == Counter(f"ProfilerStep#{s}" for s in (2, 3))
            )
            # per step: one optimizer scope; per micro-batch: one forward and one backward scope
            assert count(trace, "## optimizer ##", "ProfilerStep#") == 2
            assert count(trace, "## forward ##", "ProfilerStep#") == 2 * cfg.micro_batches
            assert count(trace, "## backward ##", "ProfilerStep#") == 2 * cfg.micro_batches


def test_pipeline_sends_and_receives_one_activation_and_one_gradient_per_micro_batch(
    runs: dict[str, Path],
) -> None:
    for name in ("pp2", "pp2tp2"):
        cfg = LAYOUTS[name]
        active = len(cfg.profiled_steps)
        for rank in range(cfg.world_size):
            trace = load(runs[name], rank)
            first = cfg.coords(rank)[0] == 0
            m = cfg.micro_batches * active
            sends, recvs = (
                ("_exec_send_activations", "_exec_recv_grads")
                if first
                else (
                    "_exec_send_grads",
                    "_exec_recv_activations",
                )
            )
            assert count(trace, "c10d::send", sends) == m
            assert count(trace, "c10d::recv_", recvs) == m
            assert len(scopes_of(trace, "c10d::send")) == len(scopes_of(trace, "c10d::recv_")) == m
            assert m == cfg.expected_p2p_per_step(rank)["send"] * active
            # the peer in c10d::send's concrete inputs is the neighbour stage's global rank
            peer = cfg.rank_of(1 if first else 0, *cfg.coords(rank)[1:])
            dsts = {e["args"]["Concrete Inputs"][2] for e in trace["traceEvents"] if e["name"] == "c10d::send"}
            assert dsts == {str(peer)}


def test_traces_keep_scalar_arguments_but_not_scalar_lists(runs: dict[str, Path]) -> None:
    # on CPU list arguments cost the traced ops fresh pages (train.records_scalar_lists); the scalars decode
    # reads stay: SDPA's is_causal, softmax's dim
    meta = json.loads((runs["pp2"] / "run.json").read_text())
    assert meta["profile"]["record_scalar_lists"] is False
    events = load(runs["pp2"], 1)["traceEvents"]
    args = {e["name"]: e["args"] for e in events if "Concrete Inputs" in e.get("args", {})}
    assert args["aten::scaled_dot_product_attention"]["Concrete Inputs"][5] == "True"
    assert args["aten::_log_softmax"]["Concrete Inputs"][1] == "1"  # cross-entropy over [tokens, vocab]
    # reshape/view sizes are lists: recorded as shapes-only ("" in Concrete Inputs)
    views = [e["args"] for e in events if e["name"] in ("aten::view", "aten::reshape") and "Input Dims" in e["args"]]
    assert views and all(a["Concrete Inputs"][1] == "" for a in views)


def test_tensor_parallel_all_reduces_two_per_layer_per_micro_batch_each_way(runs: dict[str, Path]) -> None:
    for name in ("tp2", "pp2tp2"):
        cfg = LAYOUTS[name]
        active = len(cfg.profiled_steps)
        m = cfg.micro_batches * active
        per_pass = 2 * cfg.layers_per_stage * m
        for rank in range(cfg.world_size):
            trace = load(runs[name], rank)
            first, last = cfg.coords(rank)[0] == 0, cfg.coords(rank)[0] == cfg.pp - 1
            vocab = cfg.vocab_parallel
            # blocks: two forward (row-parallel outputs), two backward (column-parallel inputs);
            # vocab-parallel: + the embedding lookup (forward) and the LM head's input (backward)
            emb, ce = m * (vocab and first), m * (vocab and last)  # per-rank extras, 0 without vocab-parallel
            assert count(trace, "c10d::allreduce_", "_ReduceFromModelParallelRegion") == per_pass + emb
            assert count(trace, "c10d::allreduce_", "_CopyToModelParallelRegionBackward") == per_pass + ce
            # vocab-parallel cross-entropy: max, target logit, sum of exponentials
            assert count(trace, "c10d::allreduce_", "_VocabParallelCrossEntropy") == 3 * ce
            forward = [p for _, p in scopes_of(trace, "c10d::allreduce_") if "## forward ##" in p]
            assert len(forward) == per_pass + emb + 3 * ce
            # no data parallelism here: every all-reduce is a TP one
            total = len(scopes_of(trace, "c10d::allreduce_"))
            assert total == cfg.expected_tp_all_reduces_per_step(rank) * active
            assert total == 2 * per_pass + emb + 4 * ce


def test_data_parallel_all_reduces_one_bucket_set_per_step(runs: dict[str, Path]) -> None:
    cfg = LAYOUTS["dp2"]
    state = ParallelState(cfg, 0, 0, 1, 0, 0, 0, None, None, None, torch.device("cpu"), "gloo")
    params = list(GPTStage(cfg, state).parameters())
    buckets = len(plan_buckets(params, cfg.bucket_bytes))
    assert buckets > 1  # the 32 KiB cap splits the tiny model's gradients
    meta = json.loads((runs["dp2"] / "run.json").read_text())
    for rank in range(2):
        trace = load(runs["dp2"], rank)
        per_step = Counter(
            next(p for p in parents if p.startswith("ProfilerStep#"))
            for _, parents in scopes_of(trace, "c10d::allreduce_")
            if "_exec_reduce_grads" in parents
        )
        assert per_step == {"ProfilerStep#2": buckets, "ProfilerStep#3": buckets}
        assert len(scopes_of(trace, "c10d::allreduce_")) == 2 * buckets
        assert meta["ranks"][rank]["expected_per_step"]["dp_all_reduce"] == buckets
    assert count(load(runs["pp2"], 0), "c10d::allreduce_", "") == 0  # dp=1: no gradient all-reduce


def test_losses_equal_the_single_rank_run(runs: dict[str, Path]) -> None:
    # the same model and 8-sample batches trained in this process without torch.distributed
    ref = reference_losses(TINY)
    assert len(ref) == TINY.steps
    assert ref[-1] < ref[0] - 0.1  # it learns: the recurrence is predictable
    for name in ("pp2", "tp2", "dp2", "pp2tp2"):
        losses = json.loads((runs[name] / "run.json").read_text())["losses"]
        assert losses == pytest.approx(ref, rel=1e-4), name


def test_run_json_describes_the_run(runs: dict[str, Path]) -> None:
    meta = json.loads((runs["pp2tp2"] / "run.json").read_text())
    expected = {
        "model": "gpt_tiny", "pp": 2, "tp": 2, "dp": 1, "world_size": 4, "nodes": 1, "gpus_per_node": 4,
        "layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 256, "micro_batches": 4,
        "micro_batch_size": 2, "steps": 4, "dtype": "float32", "device": "cpu", "backend": "gloo",
        "torch_version": torch.__version__, "seed": TINY.seed,
    }  # fmt: skip
    assert {k: meta[k] for k in expected} == expected
    assert meta["profile"]["profiled_steps"] == [2, 3]
    assert meta["threads_per_rank"] == 1  # automatic: 2 cores // 4 ranks, at least 1
    assert WorkloadConfig.from_dict(meta["config"]) == LAYOUTS["pp2tp2"]
    assert [r["trace"] for r in meta["ranks"]] == [f"rank{r}.pt.trace.json.gz" for r in range(4)]


def test_a_failing_rank_is_named_and_nothing_is_left_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "1")
    with pytest.raises(WorkloadError, match=r"workload rank 1 failed \(exit 1\): RuntimeError: fault injected"):
        run_local(replace(TINY, pp=2), tmp_path / "broken")
    assert list(tmp_path.iterdir()) == []  # no run directory, no staging directory


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rank must fail for want of a CUDA device")
def test_the_error_that_reaches_the_caller_is_the_one_in_the_ranks_error_file(tmp_path: Path) -> None:
    """A rank failing with a WorkloadError reports it in its error file and writes nothing to stderr,
    so this message (its type is the file's ``type`` field) cannot come from the stderr fallback, which
    would give the last line of stderr, or ``no output``."""
    with pytest.raises(WorkloadError) as failed:
        run_local(replace(TINY, pp=1, layers=1, device="cuda", backend="gloo"), tmp_path / "r")
    assert str(failed.value) == (
        "workload rank 0 failed (exit 2): WorkloadError: --device cuda was given but torch sees no CUDA device; "
        "use --device cpu"
    )
    assert list(tmp_path.iterdir()) == []


def test_cli_runs_the_workload_and_keeps_an_existing_run(runs: dict[str, Path], tiny_layouts: TinyLayoutRuns) -> None:
    out = runs["pp2"]
    printed = tiny_layouts.cli_output["pp2"]
    assert str(out) in printed
    assert "2 ranks (pp=2 tp=1 dp=1, gloo on cpu), 2 profiled steps (ProfilerStep#2..#3)" in printed
    before = (out / "run.json").read_text()
    again = CliRunner().invoke(app, workload_run_args(LAYOUTS["pp2"], out))
    assert again.exit_code == 2 and "already holds a run" in again.output
    assert (out / "run.json").read_text() == before


def test_ingest_decodes_matched_collectives_and_the_iterations(runs: dict[str, Path], db_path: Path) -> None:
    from tracecal.sql.connection import open_database

    result = CliRunner().invoke(app, ["ingest", str(runs["pp2"]), str(runs["tp2"]), "--db", str(db_path)])
    assert result.exit_code == 0, result.output
    pp2, tp2 = runs["pp2"].name, runs["tp2"].name
    with open_database(db_path, read_only=True) as con:
        layout = con.execute("select run_id, pp, tp, dp, world_size from runs order by run_id").fetchall()
        assert sorted(layout) == sorted([(pp2, 2, 1, 1, 2), (tp2, 1, 2, 1, 2)])
        for run in (pp2, tp2):
            iters = con.execute("select rank, list(iteration order by iteration) from iterations where run_id = ? "
                                "group by rank order by rank", [run]).fetchall()  # fmt: skip
            assert iters == [(0, [2, 3]), (1, [2, 3])]
        counts = con.execute(
            "select run_id, rank, name, role, count(*), count(match_id) from collectives group by all order by all"
        ).fetchall()
        m = TINY.micro_batches * 2  # two profiled steps
        tp_per_rank = 4 * TINY.layers * TINY.micro_batches * 2
        assert counts == sorted(
            [(pp2, r, kind, "pp", m, m) for r in (0, 1) for kind in ("recv", "send")]
            + [(tp2, r, "all_reduce", "tp", tp_per_rank, tp_per_rank) for r in (0, 1)]
        )
        # every instance is matched across ranks: a send with the peer's recv, an all-reduce on both TP ranks
        pairs = con.execute(
            "select run_id, list(name order by rank), list(rank order by rank) from collectives "
            "group by run_id, match_id"
        ).fetchall()
        assert {(run, tuple(names), tuple(ranks)) for run, names, ranks in pairs} == {
            (pp2, ("send", "recv"), (0, 1)),
            (pp2, ("recv", "send"), (0, 1)),
            (tp2, ("all_reduce", "all_reduce"), (0, 1)),
        }


def test_a_taken_rendezvous_port_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from tracecal.workload import launch

    handed_out: list[int] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()  # rank 0's store cannot listen on this port while we do
        real = launch.free_port

        def first_busy() -> int:
            handed_out.append(busy.getsockname()[1] if not handed_out else real())
            return handed_out[-1]

        monkeypatch.setattr(launch, "free_port", first_busy)
        run = run_local(replace(TINY, pp=1, layers=1, steps=3, threads=1), tmp_path / "r")
    assert (run.out_dir / "rank0.pt.trace.json.gz").is_file()
    assert len(handed_out) == 2  # the busy port failed the first launch, the second port worked


def reference_losses(cfg: WorkloadConfig) -> list[float]:
    """Plain single-process training of ``cfg``'s model and data: no torch.distributed, no schedule."""
    from torch.nn import functional as F

    from tracecal.workload.model import micro_batches

    single = replace(cfg, pp=1, tp=1, dp=1, micro_batches=cfg.dp * cfg.micro_batches)
    state = ParallelState(single, 0, 0, 1, 0, 0, 0, None, None, None, torch.device("cpu"), "gloo")
    model = GPTStage(single, state)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        losses = []
        for step in range(cfg.steps):
            optimizer.zero_grad()
            batch = micro_batches(single, 0, step)
            step_losses = []
            for x, y in batch:
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                (loss / len(batch)).backward()
                step_losses.append(loss.item())
            optimizer.step()
            losses.append(sum(step_losses) / len(step_losses))
        return losses
    finally:
        torch.set_num_threads(threads)


def test_four_stages_with_fewer_micro_batches_than_stages(tmp_path: Path) -> None:
    # middle stages send and receive both ways; 2 micro-batches of 4 keep the 8-sample global batch
    cfg = replace(TINY, pp=4, layers=4, micro_batches=2, micro_batch_size=4)
    run = run_local(cfg, tmp_path / "gpt_tiny_4_1_1").out_dir
    active = len(cfg.profiled_steps)
    for rank in range(4):
        trace = load(run, rank)
        expected = cfg.expected_p2p_per_step(rank)
        assert len(scopes_of(trace, "c10d::send")) == expected["send"] * active
        assert len(scopes_of(trace, "c10d::recv_")) == expected["recv"] * active
        if rank in (1, 2):
            assert expected == {"send": 4, "recv": 4}
            for scope in ("_exec_send_activations", "_exec_send_grads"):
                assert count(trace, "c10d::send", scope) == cfg.micro_batches * active
    losses = json.loads((run / "run.json").read_text())["losses"]
    assert losses == pytest.approx(reference_losses(cfg), rel=1e-4)


def test_under_torchrun_each_process_is_one_rank(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tracecal.workload.launch import config_args, free_port

    cfg = replace(TINY, pp=2, layers=2, steps=3)
    out = tmp_path / "gpt_tiny_2_1_1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), "-m", "tracecal.workload", *config_args(cfg), "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "run.json"]
    meta = json.loads((out / "run.json").read_text())
    assert (meta["world_size"], meta["gpus_per_node"], meta["nodes"]) == (2, 2, 1)
    assert meta["losses"] == pytest.approx(reference_losses(cfg), rel=1e-4)

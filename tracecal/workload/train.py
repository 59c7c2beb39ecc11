"""One rank of the reference workload: build the stage, train ``steps`` steps under torch.profiler,
write this rank's trace, and (rank 0) the run's ``run.json``.

Runs in a process started by ``torchrun`` or by ``launch.run_local`` (env:// rendezvous: RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Scopes in the trace:
``ProfilerStep#N`` per step (torch.profiler), ``## forward ##`` / ``## backward ##`` per micro-batch,
the pipeline transfers (``schedule.py``), ``_exec_reduce_grads`` around the data-parallel gradient
all-reduce and ``## optimizer ##`` around the AdamW step.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

from tracecal.errors import WorkloadError
from tracecal.workload.config import WorkloadConfig
from tracecal.workload.model import GPTStage, micro_batches
from tracecal.workload.parallel import ParallelState, init_parallel
from tracecal.workload.schedule import run_1f1b

REDUCE_GRADS = "_exec_reduce_grads"
OPTIMIZER = "## optimizer ##"
FAULT_ENV = "TRACECAL_WORKLOAD_FAIL_RANK"
"""Fault injection for the launcher's tests: the rank named here raises after joining the job."""


def records_scalar_lists(device_type: str) -> bool:
    """Whether the workload's profiler records list arguments in Concrete Inputs on this device type:
    on CUDA yes (torch's default), on CPU no.

    On CPU the lists' heap objects fragment glibc's heap, so traced ops take freshly mapped pages and
    run slower than unprofiled; on CUDA activations live in the caching allocator and foreach/fused
    AdamW needs the TensorList Input Dims the switch drops (see docs/workload.md, "Profiler settings";
    figures from ``benchmarks/profiler_observer.py`` in benchmarks/RESULTS.md)."""
    return device_type != "cpu"


def record_scalar_lists(enabled: bool) -> bool:
    """Switch torch.profiler's recording of list arguments in Concrete Inputs (process-wide, torch's
    default is on; see ``records_scalar_lists``) and return whether lists are recorded now.

    A torch without the switch (it is private API, absent from older releases) keeps its default:
    the return value then says lists are recorded, so run.json does not claim otherwise."""
    setter = getattr(torch._C._profiler, "_set_record_concrete_inputs_enabled_val", None)
    if setter is None:
        return True
    setter(enabled)
    return enabled


def trace_name(rank: int) -> str:
    """File name of one rank's trace in the flat run layout."""
    return f"rank{rank}.pt.trace.json.gz"


def threads_per_rank(local_world_size: int) -> int:
    """CPU threads one rank may use so the ranks of a node don't oversubscribe its cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_world_size))


def plan_buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[list[torch.nn.Parameter]]:
    """Gradient buckets for the data-parallel all-reduce, in reverse parameter order (the order
    backward produces gradients, as in DDP/Megatron); a bucket closes before it would exceed
    ``bucket_bytes``, and a parameter larger than that gets a bucket of its own."""
    buckets: list[list[torch.nn.Parameter]] = []
    current: list[torch.nn.Parameter] = []
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def reduce_gradients(buckets: list[list[torch.nn.Parameter]], state: ParallelState) -> None:
    """Average gradients over the data-parallel group: one asynchronous all-reduce per bucket."""
    dp = state.config.dp
    if dp == 1:
        return
    with record_function(REDUCE_GRADS):
        flats = [torch.cat([p.grad.reshape(-1) for p in bucket]) for bucket in buckets]  # type: ignore[union-attr]
        works = [dist.all_reduce(flat, group=state.dp_group, async_op=True) for flat in flats]
        for work, flat, bucket in zip(works, flats, buckets, strict=True):
            work.wait()
            flat.div_(dp)
            offset = 0
            for p in bucket:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
                offset += n


def autocast_for(cfg: WorkloadConfig, device: torch.device) -> Any:
    """The autocast context the forward runs under for ``cfg.dtype`` on ``device``; None for float32."""
    if cfg.dtype == "float32":
        return None
    return torch.autocast(device_type=device.type, dtype=getattr(torch, cfg.dtype))


def train_rank(cfg: WorkloadConfig, out_dir: Path) -> dict[str, Any] | None:
    """Run this rank's part of the job; return the run.json content on rank 0, None elsewhere.

    Writes ``out_dir/rank{R}.pt.trace.json.gz`` (atomically: exported to ``out_dir/.tmp`` first) and,
    on rank 0 after every rank's trace is written, ``out_dir/run.json``.

    Raises:
        WorkloadError: inconsistent configuration or environment.
    """
    cfg.validate()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    threads = cfg.threads or threads_per_rank(local_world)
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    state = init_parallel(cfg)
    # On failure the process group is deliberately left alone: the caller reports the error first,
    # and only then does the exiting process close its connections, which makes the other ranks fail
    # too — so the first error reported is the cause, not a "connection closed by peer".
    result = _train(cfg, state, out_dir, threads)
    dist.destroy_process_group()
    return result


def _train(cfg: WorkloadConfig, state: ParallelState, out_dir: Path, threads: int) -> dict[str, Any] | None:
    if os.environ.get(FAULT_ENV) == str(state.rank):
        raise RuntimeError(f"fault injected by {FAULT_ENV}={state.rank}")
    device = state.device
    stage = GPTStage(cfg, state).to(device)
    params = [p for p in stage.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    buckets = plan_buckets(params, cfg.bucket_bytes)
    autocast = autocast_for(cfg, device)
    # All data is made before profiling so the traces hold training work only.
    data = [
        [(x.to(device), y.to(device)) for x, y in micro_batches(cfg, state.dp_rank, step)] for step in range(cfg.steps)
    ]

    tmp_dir = out_dir / ".tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / trace_name(state.rank)
    partial = tmp_dir / trace_name(state.rank)

    def export(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(partial))  # a .gz path: torch gzips it
        os.replace(partial, final)

    activities = [torch.profiler.ProfilerActivity.CPU]
    scalar_lists_recorded = record_scalar_lists(records_scalar_lists(device.type))
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    # A collective on the world group before any point-to-point transfer: NCCL requires the first
    # operation on a group to involve all its ranks, and it lines the ranks up before timing.
    dist.barrier()
    step_losses: list[torch.Tensor] = []
    started = time.perf_counter()
    with torch.profiler.profile(
        activities=activities,
        record_shapes=True,
        schedule=torch.profiler.schedule(
            wait=cfg.profile_wait, warmup=cfg.profile_warmup, active=cfg.profile_active, repeat=1
        ),
        on_trace_ready=export,
    ) as prof:
        for step in range(cfg.steps):
            optimizer.zero_grad(set_to_none=False)
            losses = run_1f1b(stage, state, data[step], autocast)
            reduce_gradients(buckets, state)
            with record_function(OPTIMIZER):
                optimizer.step()
            step_losses.append(torch.stack(losses).mean() if losses else torch.zeros((), device=device))
            prof.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    train_seconds = time.perf_counter() - started
    if not final.exists():
        raise WorkloadError(f"rank {state.rank}: torch.profiler wrote no trace to {final}")

    # Everything below is outside the profiled window: collect losses and per-rank facts for run.json.
    world = cfg.world_size
    loss_sum = torch.stack(step_losses).float()
    if not (state.is_last_stage and state.tp_rank == 0):
        loss_sum = torch.zeros_like(loss_sum)
    loss_sum = (loss_sum / cfg.dp).to(device)
    dist.all_reduce(loss_sum)
    facts = torch.zeros(world, 3, dtype=torch.float64, device=device)
    facts[state.rank] = torch.tensor(
        [sum(p.numel() for p in params), len(buckets) if cfg.dp > 1 else 0, train_seconds], dtype=torch.float64
    )
    dist.all_reduce(facts)
    dist.barrier()  # every rank's trace is in place before run.json announces the run
    if state.rank != 0:
        return None
    with contextlib.suppress(OSError):  # other files in it are not ours to delete
        tmp_dir.rmdir()
    run = _run_json(cfg, state, threads, loss_sum.cpu().tolist(), facts.cpu().tolist(), scalar_lists_recorded)
    tmp = out_dir / ".run.json.tmp"
    tmp.write_text(json.dumps(run, indent=2) + "\n")
    os.replace(tmp, out_dir / "run.json")
    return run


def _run_json(
    cfg: WorkloadConfig,
    state: ParallelState,
    threads: int,
    losses: list[float],
    facts: list[list[float]],
    scalar_lists: bool,
) -> dict[str, Any]:
    device = state.device
    nodes = max(1, cfg.world_size // state.local_world_size)
    ranks: list[dict[str, Any]] = []
    for rank, (n_params, n_buckets, seconds) in enumerate(facts):
        pp_rank, dp_rank, tp_rank = cfg.coords(rank)
        ranks.append(
            {
                "rank": rank,
                "pp_rank": pp_rank,
                "dp_rank": dp_rank,
                "tp_rank": tp_rank,
                "trace": trace_name(rank),
                "parameters": int(n_params),
                "expected_per_step": {
                    **cfg.expected_p2p_per_step(rank),
                    "tp_all_reduce": cfg.expected_tp_all_reduces_per_step(rank),
                    "dp_all_reduce": int(n_buckets),
                },
                "train_seconds": round(seconds, 4),
            }
        )
    return {
        "generator": "tracecal.workload",
        "model": cfg.model,
        "pp": cfg.pp,
        "tp": cfg.tp,
        "dp": cfg.dp,
        "world_size": cfg.world_size,
        "nodes": nodes,
        "gpus_per_node": state.local_world_size,
        "layers": cfg.layers,
        "hidden": cfg.hidden,
        "heads": cfg.heads,
        "seq": cfg.seq,
        "vocab": cfg.vocab,
        "micro_batches": cfg.micro_batches,
        "micro_batch_size": cfg.micro_batch_size,
        "global_batch_size": cfg.global_batch_size,
        "steps": cfg.steps,
        "schedule": "1f1b",
        "optimizer": "AdamW",
        "lr": cfg.lr,
        "weight_decay": cfg.weight_decay,
        "bucket_bytes": cfg.bucket_bytes,
        "vocab_parallel": cfg.vocab_parallel,
        "dtype": cfg.dtype,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "backend": state.backend,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
        "seed": cfg.seed,
        "threads_per_rank": threads,
        "profile": {
            "wait": cfg.profile_wait,
            "warmup": cfg.profile_warmup,
            "active": cfg.profile_active,
            "profiled_steps": cfg.profiled_steps,
            "record_shapes": True,
            "record_scalar_lists": scalar_lists,
        },
        "losses": losses,
        "train_seconds": round(max(r["train_seconds"] for r in ranks), 4),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.to_dict(),
        "ranks": ranks,
    }

"""Process groups and the tensor-parallel layers (Megatron-LM's pattern, gloo or NCCL).

``_CopyToModelParallelRegion`` is the identity forward and an all-reduce of the gradient backward;
``_ReduceFromModelParallelRegion`` all-reduces forward and is the identity backward. A column-parallel
linear (QKV, MLP-in) holds a slice of the output features and needs the first in front of it; a
row-parallel linear (attention out-projection, MLP-out) holds a slice of the input features and needs
the second after it. Their class names are what torch.profiler records (``_CopyToModelParallelRegion``
and ``_CopyToModelParallelRegionBackward`` as cpu_ops), so traces carry Megatron's names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tracecal.errors import WorkloadError
from tracecal.workload.config import WorkloadConfig


@dataclass
class ParallelState:
    """One rank's place in the job: coordinates, its groups and the device it computes on."""

    config: WorkloadConfig
    rank: int
    local_rank: int
    local_world_size: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    tp_group: Any
    dp_group: Any
    pp_group: Any
    device: torch.device
    backend: str

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.config.pp - 1

    @property
    def next_rank(self) -> int:
        return self.config.rank_of(self.pp_rank + 1, self.dp_rank, self.tp_rank)

    @property
    def prev_rank(self) -> int:
        return self.config.rank_of(self.pp_rank - 1, self.dp_rank, self.tp_rank)


def choose_device(config: WorkloadConfig, local_rank: int) -> tuple[torch.device, str]:
    """The device and backend for this rank: CUDA + NCCL when a GPU is asked for or available."""
    want_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if want_cuda:
        if not torch.cuda.is_available():
            raise WorkloadError("--device cuda was given but torch sees no CUDA device; use --device cpu")
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    else:
        device = torch.device("cpu")
    backend = config.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise WorkloadError("--backend nccl needs CUDA devices; use --backend gloo on CPU")
    return device, backend


def init_parallel(config: WorkloadConfig) -> ParallelState:
    """Join the job (env:// rendezvous, as torchrun sets it up) and create the TP, DP and PP groups.

    Every rank creates every group, in the same order, as ``new_group`` requires. The groups carry
    ``group_desc`` tp/dp/pp so ``distributedInfo.pg_config`` in the traces names their role.

    Raises:
        WorkloadError: the environment's WORLD_SIZE does not match pp*tp*dp.
    """
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world != config.world_size:
        raise WorkloadError(
            f"the job has {world} ranks but --pp {config.pp} --tp {config.tp} --dp {config.dp} "
            f"needs {config.world_size}; launch pp*tp*dp processes"
        )
    device, backend = choose_device(config, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=config.timeout_s)
    if backend == "nccl":
        dist.init_process_group(backend, timeout=timeout, device_id=device)
    else:
        dist.init_process_group(backend, timeout=timeout)

    mine: dict[str, Any] = {}
    for role, groups in (("tp", config.tp_groups()), ("dp", config.dp_groups()), ("pp", config.pp_groups())):
        for ranks in groups:
            group = dist.new_group(ranks, group_desc=role)
            if rank in ranks:
                mine[role] = group
    pp_rank, dp_rank, tp_rank = config.coords(rank)
    return ParallelState(
        config=config,
        rank=rank,
        local_rank=local_rank,
        local_world_size=local_world,
        pp_rank=pp_rank,
        dp_rank=dp_rank,
        tp_rank=tp_rank,
        tp_group=mine["tp"],
        dp_group=mine["dp"],
        pp_group=mine["pp"],
        device=device,
        backend=backend,
    )


class _CopyToModelParallelRegion(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient over the TP group backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """All-reduce over the TP group forward; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, group: Any, tp: int) -> torch.Tensor:
    return _CopyToModelParallelRegion.apply(x, group) if tp > 1 else x


def reduce_from_tp(x: torch.Tensor, group: Any, tp: int) -> torch.Tensor:
    return _ReduceFromModelParallelRegion.apply(x, group) if tp > 1 else x


class ColumnParallelLinear(nn.Module):
    """``y = x A_i^T + b_i`` where ``A_i`` is this rank's slice of the output features.

    The input is replicated across the TP group; its gradient is summed over the group backward.
    ``weight`` and ``bias`` (or None) are this rank's shards, given already sliced (see ``model.py``).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: Any, tp: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.group = group
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.group, self.tp)
        return nn.functional.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = sum_i x_i A_i^T + b`` where ``x_i``/``A_i`` are this rank's slices of the input features.

    The partial products are all-reduced over the TP group; the bias (replicated) is added once after.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, group: Any, tp: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)
        self.group = group
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = nn.functional.linear(x, self.weight)
        return reduce_from_tp(partial, self.group, self.tp) + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, start + len(weight))`` of the embedding table (Megatron's VocabParallelEmbedding).

    Tokens outside this rank's rows look up zeros; the partial embeddings are summed over the TP
    group (``_ReduceFromModelParallelRegion``), so every rank ends with the full lookup.
    """

    def __init__(self, weight: torch.Tensor, start: int, group: Any, tp: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.start = start
        self.group = group
        self.tp = tp

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return nn.functional.embedding(tokens, self.weight)
        outside = (tokens < self.start) | (tokens >= self.start + self.weight.shape[0])
        local = (tokens - self.start).masked_fill(outside, 0)
        partial = nn.functional.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(partial, self.group, self.tp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of logits split by vocabulary over the TP group (Megatron's pattern).

    Three all-reduces forward — the row maximum (for a stable softmax), the target's logit (held by
    one rank) and the sum of exponentials — and none backward: the gradient ``softmax - onehot`` is
    local to each rank's slice of the vocabulary.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, group: Any, start: int) -> torch.Tensor:
        logits_max = logits.max(dim=-1).values
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - logits_max.unsqueeze(-1)
        outside = (target < start) | (target >= start + logits.shape[-1])
        local = (target - start).masked_fill(outside, 0)
        rows = torch.arange(logits.shape[0], device=logits.device)
        predicted = shifted[rows, local].masked_fill(outside, 0.0)
        dist.all_reduce(predicted, group=group)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local)
        return torch.log(sum_exp) - predicted

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        softmax, outside, local = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local] -= (~outside).to(grad.dtype)
        return grad.mul_(grad_loss.unsqueeze(-1)), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group: Any, start: int) -> torch.Tensor:
    """Per-token loss ``[N]`` from this rank's logits ``[N, vocab/tp]`` (vocabulary from ``start``)."""
    return _VocabParallelCrossEntropy.apply(logits, target, group, start)

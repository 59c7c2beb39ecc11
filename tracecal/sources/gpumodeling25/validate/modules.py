"""Framework modules measured as the GPU span of the kernels launched inside a CPU frame (pure).

The published GPUModeling25 measurements name modules after the DeepSpeed/GPT-NeoX Python frames
(``with_stack`` traces) or autograd nodes that enclose them: a module occurrence's time is the span
from the first to the last GPU activity launched while its frame was open. The same rule applies to
any trace that records these frames, and to the rebuilt decoded runs (``gpumodeling25.rebuild.reconstruct``).
"""

from __future__ import annotations

import re

MODULE_SCOPES = {
    "encoder_fwd": r"activation_checkpointing/checkpointing\.py(\(\d+\))?: forward$",
    "encoder_bwd": r"^CheckpointFunctionBackward$",
    "update": r"pipe/engine\.py(\(\d+\))?: train_batch$",
    "pp_p2p": r"pipe/engine\.py(\(\d+\))?: _exec_send_activations$",
    "mp_allreduce": r"^_ReduceFromModelParallelRegion$",
    "dp_allreduce": r"pipe/engine\.py(\(\d+\))?: _exec_reduce_grads$",
    "dp_allgather": r"runtime/utils\.py(\(\d+\))?: all_gather_all_partitions$",
    "stage_fwd": r"pipe/module\.py(\(\d+\))?: forward$",
    "stage_bwd": r"pipe/engine\.py(\(\d+\))?: _exec_backward_pass$",
    "optimizer": r"pipe/engine\.py(\(\d+\))?: _exec_optimizer_step$",
}
"""Published module name -> regex of the frame whose launched kernels make it (line numbers optional,
so traces of any DeepSpeed version match)."""

ANY_MODULE = "|".join(f"({p})" for p in MODULE_SCOPES.values())
"""One regex matching every module frame (what the scope query filters on)."""


def module_of(frame_name: str) -> str | None:
    """The module a frame name opens, or None."""
    return next((m for m, p in MODULE_SCOPES.items() if re.search(p, frame_name)), None)

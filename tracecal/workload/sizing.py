"""How big a reference model `tracecal demo --device cuda` trains: GPU-bound, and fitting the device.

A tiny model on a GPU measures the CPU: the demo's default GPT (hidden 256, fp32) leaves the GPU
idle most of an iteration (``../shared/data/gpu/h200/demo_tiny``), so its iteration error says
nothing about the models. ``gpu_demo_config(memory_bytes, ...)`` picks the largest of
``GPU_DEMO_SIZES`` whose estimated training memory (``training_bytes``) fits in ``MEMORY_SHARE`` of
the device's memory. The largest is the configuration traced on that H200
(``../shared/data/gpu/h200/gpt_h2048_l8_bf16``, GPU-bound; busy shares in benchmarks/RESULTS.md). A
bigger model would add sampling time, not busy share. The smaller sizes are for GPUs that cannot
hold it; those GPUs are slower, so each launch carries more
GPU work. Below the smallest, the tiny configuration runs, and the demo's headline turns to the
compute components when the share it measures says the run was CPU-bound.

Pure arithmetic; no torch (the caller reads the device's memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tracecal.errors import WorkloadError
from tracecal.workload.config import WorkloadConfig


@dataclass(frozen=True)
class ModelSize:
    """One rung of the ladder: width, depth and heads (head dimension 128)."""

    hidden: int
    layers: int
    heads: int


GPU_DEMO_SIZES = (ModelSize(2048, 8, 16), ModelSize(1536, 8, 12), ModelSize(1024, 8, 8), ModelSize(768, 6, 6))
"""Largest first. The first is the H200-measured GPU-bound configuration."""

GPU_DEMO_BASE = WorkloadConfig(
    seq=1024, vocab=32000, micro_batches=4, micro_batch_size=4, dtype="bfloat16", device="cuda", pp=1
)
"""What every rung shares: sequence 1024, vocabulary 32 000, 4 micro-batches of 4, bf16 autocast."""

MEMORY_SHARE = 0.5
"""Share of the device memory the estimate may take: the rest is for what the estimate leaves out
(allocator fragmentation, cuBLAS/cuDNN workspaces, the CUDA context) and for the sampler, which
allocates the traced shapes scaled up to 2x per dimension and a 256 MiB L2 flush buffer."""

STATE_BYTES_PER_PARAM = 16
"""fp32 weight and gradient, AdamW's two fp32 moments."""
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 40
"""Saved activations of one block per token and hidden unit under bf16 autocast with fused
attention (Korthikanti et al. 2022 count 34 without the attention scores; rounded up for the fp32
LayerNorm inputs autocast keeps)."""
LOGIT_BYTES = 10
"""Per token and vocabulary entry: bf16 logits, their fp32 log-softmax and its gradient."""


def parameter_count(cfg: WorkloadConfig) -> int:
    """Parameters of the reference GPT (``model.py``): blocks, token and position embeddings, final
    LayerNorm and the untied LM head (no bias)."""
    h = cfg.hidden
    block = 4 * h * h + 4 * h + 2 * cfg.ffn_hidden * h + cfg.ffn_hidden + h + 4 * h  # attn, mlp, 2 norms
    return cfg.layers * block + cfg.vocab * h + cfg.seq * h + 2 * h + h * cfg.vocab


def training_bytes(cfg: WorkloadConfig) -> int:
    """Estimated peak device memory of training ``cfg`` on one rank holding the whole model: weights,
    gradients and AdamW state, the activations of the micro-batches in flight (1F1B keeps up to
    ``pp`` of them), and the LM head's logits."""
    tokens = cfg.micro_batch_size * cfg.seq
    in_flight = min(cfg.pp, cfg.micro_batches)
    activations = in_flight * cfg.layers * tokens * cfg.hidden * ACTIVATION_BYTES_PER_TOKEN_HIDDEN
    return STATE_BYTES_PER_PARAM * parameter_count(cfg) + activations + tokens * cfg.vocab * LOGIT_BYTES


def gpu_demo_config(memory_bytes: int, pp: int = 1, tp: int = 1, dp: int = 1, steps: int = 10) -> WorkloadConfig:
    """The demo's configuration on GPUs of ``memory_bytes`` each: the largest ``GPU_DEMO_SIZES`` rung
    whose ``training_bytes`` fits in ``MEMORY_SHARE`` of it (layers rounded up to a multiple of
    ``pp``), named ``gpt_h{hidden}_l{layers}_bf16``; the tiny fp32 default when none fits.

    Raises:
        WorkloadError: a layout the configuration cannot take (heads not divisible by ``tp``, ...).
    """
    if memory_bytes <= 0:
        raise WorkloadError(f"device memory must be positive, got {memory_bytes} bytes")
    for size in GPU_DEMO_SIZES:
        layers = -(-size.layers // pp) * pp
        cfg = replace(
            GPU_DEMO_BASE,
            hidden=size.hidden,
            layers=layers,
            heads=size.heads,
            pp=pp,
            tp=tp,
            dp=dp,
            steps=steps,
            model=f"gpt_h{size.hidden}_l{layers}_bf16",
        )
        if training_bytes(cfg) <= MEMORY_SHARE * memory_bytes:
            return cfg.validate()
    return WorkloadConfig(pp=pp, tp=tp, dp=dp, steps=steps, device="cuda").validate()

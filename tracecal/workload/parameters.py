"""The parameters one rank of the reference workload holds, and its gradient buckets (pure, no torch).

``stage_parameters`` lists, in ``GPTStage.parameters()`` order (a module's own parameters before its
submodules'), the name and shape of every parameter of one pipeline stage's tensor-parallel shard, as
``model.py`` builds them. ``gradient_buckets`` packs them as ``train.plan_buckets`` does: reverse
parameter order, a bucket closes before it would exceed ``bucket_bytes``.
"""

from __future__ import annotations

from math import prod

from tracecal.workload.config import WorkloadConfig

FLOAT32_BYTES = 4
"""Parameters and gradients are fp32 (``--dtype bfloat16`` autocasts the forward only)."""


def block_parameters(cfg: WorkloadConfig, index: int) -> list[tuple[str, tuple[int, ...]]]:
    """One transformer block's parameters on one tensor-parallel rank."""
    h, t, ffn = cfg.hidden, cfg.tp, cfg.ffn_hidden
    p = f"blocks.{index}"
    return [
        (f"{p}.ln1.weight", (h,)),
        (f"{p}.ln1.bias", (h,)),
        (f"{p}.qkv.weight", (3 * h // t, h)),
        (f"{p}.qkv.bias", (3 * h // t,)),
        (f"{p}.attn_out.weight", (h, h // t)),
        (f"{p}.attn_out.bias", (h,)),
        (f"{p}.ln2.weight", (h,)),
        (f"{p}.ln2.bias", (h,)),
        (f"{p}.mlp_in.weight", (ffn // t, h)),
        (f"{p}.mlp_in.bias", (ffn // t,)),
        (f"{p}.mlp_out.weight", (h, ffn // t)),
        (f"{p}.mlp_out.bias", (h,)),
    ]


def stage_parameters(cfg: WorkloadConfig, pp_rank: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter of stage ``pp_rank`` on one tensor-parallel rank, in ``parameters()`` order."""
    first, last = pp_rank == 0, pp_rank == cfg.pp - 1
    vocab = cfg.vocab // cfg.tp if cfg.vocab_parallel and cfg.tp > 1 else cfg.vocab
    out: list[tuple[str, tuple[int, ...]]] = []
    if first:
        out += [("pos.weight", (cfg.seq, cfg.hidden)), ("embed.weight", (vocab, cfg.hidden))]
    start = pp_rank * cfg.layers_per_stage
    for i in range(start, start + cfg.layers_per_stage):
        out += block_parameters(cfg, i)
    if last:
        out += [
            ("final_norm.weight", (cfg.hidden,)),
            ("final_norm.bias", (cfg.hidden,)),
            ("head.weight", (vocab, cfg.hidden)),
        ]
    return out


def gradient_buckets(shapes: list[tuple[int, ...]], bucket_bytes: int) -> list[list[int]]:
    """Indexes into ``shapes`` per data-parallel gradient bucket, in the order they are all-reduced."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(shapes))):
        nbytes = prod(shapes[i]) * FLOAT32_BYTES
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets

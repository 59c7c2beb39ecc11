"""A small GPT split into pipeline stages and tensor-parallel shards, with layout-independent weights.

Every parameter's *full* value is drawn from its own generator, seeded by the run seed and the
parameter's global name (``blocks.3.mlp_in.weight``), and each rank keeps only its slice. So a layer
has the same weights whichever stage holds it and however it is sharded, and a PP2, TP2 or DP2 run
starts from exactly the single-rank run's weights — which is what lets the tests compare losses.

Architecture (GPT-2 style, pre-norm, no dropout so runs are deterministic): token + learned position
embedding; per block LayerNorm → causal self-attention (column-parallel QKV, row-parallel
out-projection) → residual, LayerNorm → MLP 4h with GELU (column-parallel in, row-parallel out) →
residual; final LayerNorm and an untied LM head on the last stage. Embedding and head are replicated
over the TP group, or with ``vocab_parallel`` split by vocabulary (Megatron's VocabParallelEmbedding,
column-parallel head and vocab-parallel cross-entropy).
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn
from torch.nn import functional as F

from tracecal.workload.config import WorkloadConfig
from tracecal.workload.parallel import (
    ColumnParallelLinear,
    ParallelState,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)


def full_tensor(seed: int, name: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
    """The full (unsharded) initial value of parameter ``name``: N(0, std²), reproducible per name."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62))
    return torch.randn(shape, generator=generator) * std


def _rows(t: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    size = t.shape[0] // parts
    return t[part * size : (part + 1) * size].clone()


def _cols(t: torch.Tensor, part: int, parts: int) -> torch.Tensor:
    size = t.shape[1] // parts
    return t[:, part * size : (part + 1) * size].clone()


def _layer_norm(hidden: int) -> nn.LayerNorm:
    # LayerNorm initialises to ones/zeros deterministically; replicated on every TP rank.
    return nn.LayerNorm(hidden)


class Block(nn.Module):
    """One pre-norm transformer block holding this rank's TP shard of global layer ``index``."""

    def __init__(self, cfg: WorkloadConfig, state: ParallelState, index: int) -> None:
        super().__init__()
        h, tp, part, group = cfg.hidden, cfg.tp, state.tp_rank, state.tp_group
        out_std = 0.02 / math.sqrt(2 * cfg.layers)  # GPT-2's scaled init of residual projections
        prefix = f"blocks.{index}"
        self.local_heads = cfg.heads // tp
        self.head_dim = cfg.head_dim
        self.ln1 = _layer_norm(h)
        # QKV: slice q, k and v by heads separately so a shard holds whole heads of each.
        q, k, v = (full_tensor(cfg.seed, f"{prefix}.attn.{n}.weight", (h, h), 0.02) for n in "qkv")
        qkv = torch.cat([_rows(q, part, tp), _rows(k, part, tp), _rows(v, part, tp)])
        self.qkv = ColumnParallelLinear(qkv, torch.zeros(3 * h // tp), group, tp)
        out = full_tensor(cfg.seed, f"{prefix}.attn.out.weight", (h, h), out_std)
        self.attn_out = RowParallelLinear(_cols(out, part, tp), torch.zeros(h), group, tp)
        self.ln2 = _layer_norm(h)
        ffn = cfg.ffn_hidden
        w_in = full_tensor(cfg.seed, f"{prefix}.mlp_in.weight", (ffn, h), 0.02)
        self.mlp_in = ColumnParallelLinear(_rows(w_in, part, tp), torch.zeros(ffn // tp), group, tp)
        w_out = full_tensor(cfg.seed, f"{prefix}.mlp_out.weight", (h, ffn), out_std)
        self.mlp_out = RowParallelLinear(_cols(w_out, part, tp), torch.zeros(h), group, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x))
        q, k, v = (t.view(b, s, self.local_heads, self.head_dim).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn = attn.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)
        x = x + self.attn_out(attn)
        return x + self.mlp_out(F.gelu(self.mlp_in(self.ln2(x))))


class GPTStage(nn.Module):
    """The layers of one pipeline stage.

    ``forward`` takes token ids ``[b, s]`` on the first stage and the previous stage's activations
    ``[b, s, hidden]`` elsewhere; it returns activations, or logits ``[b, s, vocab]`` on the last stage.
    """

    def __init__(self, cfg: WorkloadConfig, state: ParallelState) -> None:
        super().__init__()
        self.first = state.is_first_stage
        self.last = state.is_last_stage
        self.group, self.tp = state.tp_group, cfg.tp
        # with --vocab-parallel this rank holds vocabulary rows [vocab_start, vocab_start + vocab/tp)
        self.vocab_parallel = cfg.vocab_parallel and cfg.tp > 1
        self.vocab_start = state.tp_rank * cfg.vocab // cfg.tp if self.vocab_parallel else 0
        parts = cfg.tp if self.vocab_parallel else 1
        part = state.tp_rank if self.vocab_parallel else 0
        self.embed: nn.Module
        self.head: nn.Module
        if self.first:
            table = _rows(full_tensor(cfg.seed, "embed.weight", (cfg.vocab, cfg.hidden), 0.02), part, parts)
            self.embed = VocabParallelEmbedding(table, self.vocab_start, self.group, parts)
            self.pos = nn.Parameter(full_tensor(cfg.seed, "pos.weight", (cfg.seq, cfg.hidden), 0.01))
        start = state.pp_rank * cfg.layers_per_stage
        self.blocks = nn.ModuleList(Block(cfg, state, i) for i in range(start, start + cfg.layers_per_stage))
        if self.last:
            self.final_norm = _layer_norm(cfg.hidden)
            head = _rows(full_tensor(cfg.seed, "head.weight", (cfg.vocab, cfg.hidden), 0.02), part, parts)
            self.head = ColumnParallelLinear(head, None, self.group, parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if self.last:
            x = self.head(self.final_norm(x))
        return x

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the last stage's logits (this rank's vocabulary slice when vocab-parallel)."""
        flat, flat_targets = logits.float().flatten(0, 1), targets.flatten()
        if self.vocab_parallel:
            return vocab_parallel_cross_entropy(flat, flat_targets, self.group, self.vocab_start).mean()
        return F.cross_entropy(flat, flat_targets)


def synthetic_batch(cfg: WorkloadConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: ``(inputs, targets)``, each ``[global_batch_size, seq]`` int64.

    Each sample follows ``t[i+1] = (31·t[i] + 7) mod vocab`` from a random start, so the next token is
    a function of the current one: the model can learn it and the loss falls within a few steps.
    Samples depend only on (seed, step, sample index), not on the parallel layout.
    """
    generator = torch.Generator().manual_seed(cfg.seed * 7919 + step)
    starts = torch.randint(0, cfg.vocab, (cfg.global_batch_size, 1), generator=generator)
    # Closed form of the recurrence: t[i] = (a_i·t[0] + c_i) mod vocab, a_i = 31^i, c_i = 7·(1+31+…+31^(i-1)).
    a, c = [1], [0]
    for _ in range(cfg.seq):
        a.append(a[-1] * 31 % cfg.vocab)
        c.append((c[-1] * 31 + 7) % cfg.vocab)
    tokens = (torch.tensor(a)[None, :] * starts + torch.tensor(c)[None, :]) % cfg.vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def micro_batches(cfg: WorkloadConfig, dp_rank: int, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This data-parallel rank's micro-batches of ``step``: contiguous slices of the global batch."""
    inputs, targets = synthetic_batch(cfg, step)
    mbs = cfg.micro_batch_size
    base = dp_rank * cfg.micro_batches * mbs
    return [
        (inputs[base + m * mbs : base + (m + 1) * mbs], targets[base + m * mbs : base + (m + 1) * mbs])
        for m in range(cfg.micro_batches)
    ]

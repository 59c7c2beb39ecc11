"""The reference workload's configuration and its Megatron process-group layout (pure Python, no torch).

Ranks are laid out like Megatron-LM: tensor-parallel fastest, then data-parallel, then pipeline::

    rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

so a TP group is a run of ``tp`` consecutive ranks, a DP group strides by ``tp`` inside one pipeline
stage, and a PP group strides by ``dp * tp``. Everything here is plain arithmetic that the launcher,
the ranks and the tests share; it never imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from tracecal.errors import WorkloadError

DTYPES = ("float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class WorkloadConfig:
    """Everything that determines a reference training run.

    Sizes: ``layers`` transformer blocks split evenly over ``pp`` stages; ``hidden`` model width with
    ``heads`` attention heads (each shard holds ``heads / tp``); ``seq`` tokens per sample; ``vocab``
    tokens. A step processes ``micro_batches`` micro-batches of ``micro_batch_size`` samples on every
    data-parallel rank, so the global batch is ``dp * micro_batches * micro_batch_size`` samples.

    Profiling: the torch.profiler schedule skips ``profile_wait`` steps, warms up for
    ``profile_warmup`` and records the remaining ``steps - wait - warmup`` steps.

    ``bucket_bytes`` caps the size of one data-parallel gradient all-reduce (gradients are packed
    into buckets in reverse parameter order, as DDP and Megatron do).

    ``vocab_parallel`` shards the embedding and LM head over the TP group by vocabulary, with
    Megatron's vocab-parallel cross-entropy (otherwise both are replicated on every TP rank).

    ``threads`` is the CPU threads per rank; 0 means ``max(1, cores // ranks on the node)``. On a
    machine already busy with other work, 1 can be much faster than 2 (OpenMP threads that wait for
    each other on oversubscribed cores).
    """

    pp: int = 2
    tp: int = 1
    dp: int = 1
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    seq: int = 128
    vocab: int = 1024
    micro_batches: int = 4
    micro_batch_size: int = 2
    steps: int = 6
    profile_wait: int = 1
    profile_warmup: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.01
    bucket_bytes: int = 1 << 20
    seed: int = 1234
    dtype: str = "float32"
    device: str = "auto"
    backend: str = "auto"
    model: str = "gpt_tiny"
    timeout_s: float = 300.0
    threads: int = 0
    vocab_parallel: bool = False

    # --- derived sizes -------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.pp * self.tp * self.dp

    @property
    def layers_per_stage(self) -> int:
        return self.layers // self.pp

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_hidden(self) -> int:
        return 4 * self.hidden

    @property
    def global_batch_size(self) -> int:
        return self.dp * self.micro_batches * self.micro_batch_size

    @property
    def profile_active(self) -> int:
        return self.steps - self.profile_wait - self.profile_warmup

    @property
    def profiled_steps(self) -> list[int]:
        """Step indices (0-based, as in ``ProfilerStep#N``) recorded in the traces."""
        first = self.profile_wait + self.profile_warmup
        return list(range(first, self.steps))

    def validate(self) -> WorkloadConfig:
        """Check the configuration is consistent; return self.

        Raises:
            WorkloadError: naming the inconsistent values and what would fix them.
        """
        for name in ("pp", "tp", "dp", "layers", "hidden", "heads", "seq", "micro_batches",
                     "micro_batch_size", "steps", "bucket_bytes"):  # fmt: skip
            if getattr(self, name) < 1:
                raise WorkloadError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.vocab < 2:
            raise WorkloadError(f"--vocab must be at least 2 (got {self.vocab})")
        if self.vocab_parallel and self.vocab % self.tp:
            raise WorkloadError(
                f"--vocab {self.vocab} is not divisible by --tp {self.tp}; --vocab-parallel gives each "
                "tensor-parallel rank vocab/tp rows"
            )
        if self.threads < 0:
            raise WorkloadError(f"--threads must be 0 (automatic) or more (got {self.threads})")
        if self.profile_wait < 0 or self.profile_warmup < 0:
            raise WorkloadError("profile wait and warm-up steps cannot be negative")
        if self.layers % self.pp:
            raise WorkloadError(
                f"--layers {self.layers} is not divisible by --pp {self.pp}; "
                "every pipeline stage needs the same number of layers"
            )
        if self.hidden % self.heads:
            raise WorkloadError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}")
        if self.heads % self.tp:
            raise WorkloadError(
                f"--heads {self.heads} is not divisible by --tp {self.tp}; "
                "each tensor-parallel rank holds heads/tp heads"
            )
        if self.profile_active < 1:
            raise WorkloadError(
                f"--steps {self.steps} leaves no profiled step after {self.profile_wait} wait and "
                f"{self.profile_warmup} warm-up steps; "
                f"use --steps {self.profile_wait + self.profile_warmup + 1} or more"
            )
        if self.dtype not in DTYPES:
            raise WorkloadError(f"--dtype {self.dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise WorkloadError(f"--device {self.device!r} is not supported; use one of {', '.join(DEVICES)}")
        if self.backend not in BACKENDS:
            raise WorkloadError(f"--backend {self.backend!r} is not supported; use one of {', '.join(BACKENDS)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> WorkloadConfig:
        """Build from a mapping, ignoring keys that are not configuration fields (e.g. run.json extras)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    # --- Megatron layout -----------------------------------------------------------------------------

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(pp_rank, dp_rank, tp_rank)`` of a global rank."""
        if not 0 <= rank < self.world_size:
            raise WorkloadError(f"rank {rank} is outside a world of {self.world_size} ranks")
        pp_rank, rest = divmod(rank, self.dp * self.tp)
        dp_rank, tp_rank = divmod(rest, self.tp)
        return pp_rank, dp_rank, tp_rank

    def rank_of(self, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
        return pp_rank * self.dp * self.tp + dp_rank * self.tp + tp_rank

    def tp_groups(self) -> list[list[int]]:
        """Tensor-parallel groups: consecutive ranks."""
        return [[self.rank_of(p, d, t) for t in range(self.tp)] for p in range(self.pp) for d in range(self.dp)]

    def dp_groups(self) -> list[list[int]]:
        """Data-parallel groups: same stage and TP rank, stride ``tp``."""
        return [[self.rank_of(p, d, t) for d in range(self.dp)] for p in range(self.pp) for t in range(self.tp)]

    def pp_groups(self) -> list[list[int]]:
        """Pipeline groups: same DP and TP rank, stride ``dp * tp``."""
        return [[self.rank_of(p, d, t) for p in range(self.pp)] for d in range(self.dp) for t in range(self.tp)]

    # --- what a trace of this run must contain (used by tests and by run.json) -----------------------

    def expected_p2p_per_step(self, rank: int) -> dict[str, int]:
        """Point-to-point operations one rank issues per step under 1F1B.

        Every micro-batch's activation goes forward once and its gradient back once across each stage
        boundary, so a middle stage sends and receives ``2 * micro_batches`` tensors, an end stage half.
        """
        pp_rank, _, _ = self.coords(rank)
        has_next = pp_rank < self.pp - 1
        has_prev = pp_rank > 0
        m = self.micro_batches
        return {"send": m * (int(has_next) + int(has_prev)), "recv": m * (int(has_next) + int(has_prev))}

    def expected_tp_all_reduces_per_step(self, rank: int = 0) -> int:
        """TP all-reduces one rank issues per step: per layer and micro-batch two in the forward pass
        (after the attention and MLP row-parallel projections) and two in the backward pass (the
        gradients of the column-parallel inputs). With ``vocab_parallel`` also, per micro-batch, one
        after the embedding lookup on the first stage and, on the last stage, three in the
        cross-entropy (max, target logit, sum of exponentials) plus one for the gradient of the LM
        head's input. Zero without tensor parallelism."""
        if self.tp == 1:
            return 0
        per_micro_batch = 4 * self.layers_per_stage
        if self.vocab_parallel:
            pp_rank = self.coords(rank)[0]
            per_micro_batch += int(pp_rank == 0) + 4 * int(pp_rank == self.pp - 1)
        return per_micro_batch * self.micro_batches


TINY = WorkloadConfig(
    layers=2, hidden=64, heads=4, seq=32, vocab=256, micro_batches=4, micro_batch_size=2, steps=4, timeout_s=120
)
"""The smallest configuration worth tracing: seconds per run on two CPU cores (tests, benchmarks)."""

TINY_LAYOUTS = {
    "pp2": replace(TINY, pp=2),
    "tp2": replace(TINY, pp=1, tp=2),
    # the global batch stays 8 samples: 2 replicas x 2 micro-batches x 2
    "dp2": replace(TINY, pp=1, dp=2, micro_batches=2, bucket_bytes=32 * 1024),
    # embedding, LM head and cross-entropy split by vocabulary over the TP pair
    "pp2tp2": replace(TINY, pp=2, tp=2, vocab_parallel=True),
}
"""The four parallel layouts CI trains at ``TINY`` size, by name."""

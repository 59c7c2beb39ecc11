"""The order in which one pipeline stage of the reference workload runs its step (pure, no torch).

``schedule.run_1f1b`` executes this order; ``stage_instructions`` states it without running anything,
so a rebuilt iteration (``tracecal predict RUN --layout``) follows the workload's own schedule. 1F1B
(PipeDream-Flush): stage ``s`` of ``p`` runs ``min(p - s - 1, m)`` warm-up forwards, then alternates
one forward and one backward, then drains the remaining backwards. Every point-to-point exchange is one
``communicate`` call: its transfers are posted in Megatron's even/odd order (even stages send first,
odd stages receive first), then all of them are waited for.
"""

from __future__ import annotations

from dataclasses import dataclass

SEND_ACTIVATIONS = "_exec_send_activations"
RECV_ACTIVATIONS = "_exec_recv_activations"
SEND_GRADS = "_exec_send_grads"
RECV_GRADS = "_exec_recv_grads"
FORWARD = "## forward ##"
BACKWARD = "## backward ##"

_ODD_ORDER = {RECV_ACTIVATIONS: 0, SEND_ACTIVATIONS: 1, RECV_GRADS: 2, SEND_GRADS: 3}
"""The post order of an odd stage (an even stage posts in the order the call lists them)."""


@dataclass(frozen=True)
class Instruction:
    """One step of a stage: ``FORWARD``/``BACKWARD`` of ``micro_batch``, or one ``communicate`` call
    (``kind == "communicate"``) posting ``posts`` (scope names) in order, then waiting for them all."""

    kind: str
    micro_batch: int | None = None
    posts: tuple[str, ...] = ()


COMMUNICATE = "communicate"


def _communicate(pp_rank: int, *posts: str) -> Instruction:
    ordered = sorted(posts, key=_ODD_ORDER.__getitem__) if pp_rank % 2 else list(posts)
    return Instruction(COMMUNICATE, posts=tuple(ordered))


def stage_instructions(pp: int, pp_rank: int, micro_batches: int) -> list[Instruction]:
    """The 1F1B instructions of stage ``pp_rank`` of ``pp`` over ``micro_batches`` micro-batches, in
    the order ``schedule.run_1f1b`` runs them."""
    first, last = pp_rank == 0, pp_rank == pp - 1
    m = micro_batches
    warmup = min(pp - pp_rank - 1, m)
    out: list[Instruction] = []
    for i in range(warmup):
        if not first:
            out.append(_communicate(pp_rank, RECV_ACTIVATIONS))
        out.append(Instruction(FORWARD, i))
        if not last:
            out.append(_communicate(pp_rank, SEND_ACTIVATIONS))
    remaining = m - warmup
    if remaining > 0 and not first:
        out.append(_communicate(pp_rank, RECV_ACTIVATIONS))
    for i in range(remaining):
        out.append(Instruction(FORWARD, warmup + i))
        if not last:
            out.append(_communicate(pp_rank, SEND_ACTIVATIONS, RECV_GRADS))
        out.append(Instruction(BACKWARD, i))
        if i == remaining - 1:
            if not first:
                out.append(_communicate(pp_rank, SEND_GRADS))
        elif not first:
            out.append(_communicate(pp_rank, SEND_GRADS, RECV_ACTIVATIONS))
    for j in range(warmup):
        if not last:
            out.append(_communicate(pp_rank, RECV_GRADS))
        out.append(Instruction(BACKWARD, remaining + j))
        if not first:
            out.append(_communicate(pp_rank, SEND_GRADS))
    return out

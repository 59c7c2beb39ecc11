"""The instruction stream of one pipeline stage in DeepSpeed's 1F1B training schedule (pure).

DeepSpeed's pipeline engine (``deepspeed/runtime/pipe/schedule.py``, ``TrainSchedule``) runs a batch
of ``m`` micro-batches over ``p`` stages in ``2 (m + p - 1)`` steps. At each step a stage either runs
the forward of one micro-batch or the backward of one, in alternating parity with its neighbours, so
that after a warm-up of ``p - s - 1`` forwards, stage ``s`` alternates one forward and one backward
(1F1B). Around the computation, a forward step first sends the previous micro-batch's input gradient
back and receives this micro-batch's activations; a backward step receives the output gradient and
sends the previous forward's activations on. The last step adds the gradient reduction and the
optimizer step, and ``train_batch`` then aggregates the loss. This module reproduces that order
(documented in ``docs/published-runs.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

INSTRUCTIONS = (
    "load_micro_batch",
    "forward",
    "backward",
    "send_activation",
    "recv_activation",
    "send_grad",
    "recv_grad",
    "reduce_tied_grads",
    "reduce_grads",
    "optimizer_step",
    "aggregate_loss",
)
"""Instruction kinds, named after DeepSpeed's ``PipeInstruction`` classes; ``aggregate_loss`` is what
``train_batch`` runs after the schedule (``_aggregate_total_loss``: the last stage's loss, averaged
over its data-parallel group, broadcast to every stage)."""


@dataclass(frozen=True)
class Instruction:
    """One instruction of a stage: its kind and the micro-batch it works on (None for batch-wide ones)."""

    kind: str
    micro_batch: int | None = None


def _step_micro_batch(step: int, stage: int, stages: int) -> tuple[int, bool]:
    """(micro-batch, is_forward) that ``stage`` works on at ``step``; the micro-batch may be out of range
    (the stage idles in that step)."""
    even_step, even_stage = step % 2 == 0, stage % 2 == 0
    if even_step == even_stage:  # forward steps: even stages on even steps, odd stages on odd steps
        base = step // 2 if even_step else (step - 1) // 2
        return base - stage // 2, True
    if even_step:  # odd stage, backward
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False  # even stage, backward


def stage_instructions(stage: int, stages: int, micro_batches: int) -> list[Instruction]:
    """The instructions ``stage`` (0-based) executes for one batch, in order.

    Raises:
        ValueError: a size is not positive or the stage is out of range.
    """
    if stages < 1 or micro_batches < 1 or not 0 <= stage < stages:
        raise ValueError(f"stage {stage} of {stages} with {micro_batches} micro-batches is not a pipeline")

    def valid(mb: int) -> bool:
        return 0 <= mb < micro_batches

    first, last = stage == 0, stage == stages - 1
    out: list[Instruction] = []
    previous = -1
    total = 2 * (micro_batches + stages - 1)
    for step in range(total):
        mb, forward = _step_micro_batch(step, stage, stages)
        if forward:
            if valid(previous) and not first:
                out.append(Instruction("send_grad", previous))
            if valid(mb) and not first:
                out.append(Instruction("recv_activation", mb))
        else:
            if valid(mb) and not last:
                out.append(Instruction("recv_grad", mb))
            if valid(previous) and not last:
                out.append(Instruction("send_activation", previous))
        if (first or last) and forward and valid(mb):
            out.append(Instruction("load_micro_batch", mb))
        if valid(mb):
            out.append(Instruction("forward" if forward else "backward", mb))
        if step == total - 1:
            out.extend(
                Instruction(kind) for kind in ("reduce_tied_grads", "reduce_grads", "optimizer_step", "aggregate_loss")
            )
        previous = mb
    return out

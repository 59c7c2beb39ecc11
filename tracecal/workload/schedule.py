"""The 1F1B pipeline schedule (PipeDream-Flush, as Megatron-LM's non-interleaved schedule).

Stage ``s`` of ``p`` runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
backward until every micro-batch's forward is done, then drains the remaining backwards. Activations
go to the next stage and gradients come back through point-to-point transfers on the default (world)
group with global peer ranks, so a trace's send/recv carries the peer's global rank.

Deadlock avoidance follows Megatron's unbatched ``_p2p_ops``: even stages post send-then-receive,
odd stages receive-then-send, so two neighbours always post their matching operations in the same
order (this matters on NCCL, where a send can block until its receive is posted; gloo's isend/irecv
never block). Each transfer runs inside a scope named like DeepSpeed's pipeline engine
(``_exec_send_activations``, ``_exec_recv_activations``, ``_exec_send_grads``, ``_exec_recv_grads``),
micro-batch compute inside Megatron/NeoX-style ``## forward ##`` and ``## backward ##``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

from tracecal.workload.model import GPTStage
from tracecal.workload.parallel import ParallelState
from tracecal.workload.pipeline_order import (  # the scope names, declared with the pure order
    BACKWARD,
    FORWARD,
    RECV_ACTIVATIONS,
    RECV_GRADS,
    SEND_ACTIVATIONS,
    SEND_GRADS,
)


class _P2P:
    """One stage's point-to-point transfers: activations ``[mbs, seq, hidden]`` fp32 both ways."""

    def __init__(self, state: ParallelState) -> None:
        cfg = state.config
        self.state = state
        self.shape = (cfg.micro_batch_size, cfg.seq, cfg.hidden)
        self.even = state.pp_rank % 2 == 0

    def _buffer(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=torch.float32, device=self.state.device)

    def communicate(
        self,
        send_next: torch.Tensor | None = None,
        recv_prev: bool = False,
        send_prev: torch.Tensor | None = None,
        recv_next: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Post the requested transfers in Megatron's even/odd order, wait, return (from_prev, from_next)."""
        st = self.state
        from_prev = self._buffer() if recv_prev else None
        from_next = self._buffer() if recv_next else None
        posts: list[tuple[str, Any]] = []
        if send_next is not None:
            posts.append((SEND_ACTIVATIONS, lambda: dist.isend(send_next.contiguous(), st.next_rank)))
        if from_prev is not None:
            posts.append((RECV_ACTIVATIONS, lambda: dist.irecv(from_prev, st.prev_rank)))
        if send_prev is not None:
            posts.append((SEND_GRADS, lambda: dist.isend(send_prev.contiguous(), st.prev_rank)))
        if from_next is not None:
            posts.append((RECV_GRADS, lambda: dist.irecv(from_next, st.next_rank)))
        if not self.even:
            # odd stages: recv_prev before send_next, recv_next before send_prev
            order = {RECV_ACTIVATIONS: 0, SEND_ACTIVATIONS: 1, RECV_GRADS: 2, SEND_GRADS: 3}
            posts.sort(key=lambda p: order[p[0]])
        requests = []
        for scope, post in posts:
            with record_function(scope):
                requests.append(post())
        for request in requests:
            request.wait()
        return from_prev, from_next


def run_1f1b(
    stage: GPTStage,
    state: ParallelState,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    autocast: AbstractContextManager[Any] | None = None,
) -> list[torch.Tensor]:
    """Forward and backward every micro-batch of one step through this stage; gradients accumulate.

    Args:
        stage: this rank's ``GPTStage``.
        state: this rank's ``ParallelState``.
        batches: ``(tokens, targets)`` per micro-batch, on ``state.device``; only the first stage reads
            tokens and only the last reads targets.
        autocast: context for the forward compute (mixed precision), or None.

    Returns:
        The unscaled cross-entropy loss of each micro-batch on the last stage (0-d tensors, kept on
        the device so the schedule never waits for the GPU); ``[]`` elsewhere.
        Each micro-batch's loss is divided by the number of micro-batches before backward, so the
        accumulated gradients are those of the mean loss.
    """
    p2p = _P2P(state)
    m = len(batches)
    warmup = min(state.config.pp - state.pp_rank - 1, m)
    losses: list[torch.Tensor] = []
    pending: list[tuple[torch.Tensor | None, torch.Tensor]] = []
    first, last = state.is_first_stage, state.is_last_stage

    def forward(index: int, received: torch.Tensor | None) -> torch.Tensor:
        tokens, targets = batches[index]
        with record_function(FORWARD), autocast or nullcontext():
            out = stage(tokens if first else received)
            if last:
                loss = stage.loss(out, targets)
                losses.append(loss.detach())
                out = loss / m
        return out

    def backward(received: torch.Tensor | None, out: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor | None:
        with record_function(BACKWARD):
            torch.autograd.backward(out, grad_tensors=grad)
        return None if received is None else received.grad

    def recv_forward() -> torch.Tensor | None:
        if first:
            return None
        received, _ = p2p.communicate(recv_prev=True)
        return cast(torch.Tensor, received).requires_grad_()  # asked for, so allocated

    for i in range(warmup):
        received = recv_forward()
        out = forward(i, received)
        if not last:
            p2p.communicate(send_next=out.detach())
        pending.append((received, out))

    remaining = m - warmup
    received = recv_forward() if remaining > 0 else None
    for i in range(remaining):
        out = forward(warmup + i, received)
        grad = None
        if not last:
            _, grad = p2p.communicate(send_next=out.detach(), recv_next=True)
        pending.append((received, out))
        old_received, old_out = pending.pop(0)
        input_grad = backward(old_received, old_out, grad)
        if i == remaining - 1:
            if not first:
                p2p.communicate(send_prev=input_grad)
            received = None
        elif first:
            received = None
        else:
            new_received, _ = p2p.communicate(send_prev=input_grad, recv_prev=True)
            received = cast(torch.Tensor, new_received).requires_grad_()

    for _ in range(warmup):
        old_received, old_out = pending.pop(0)
        _, grad = p2p.communicate(recv_next=True) if not last else (None, None)
        input_grad = backward(old_received, old_out, grad)
        if not first:
            p2p.communicate(send_prev=input_grad)
    return losses

"""`tracecal workload run`: train the reference GPT with PP/TP/DP on local CPU processes, profiled."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracecal.cli.common import stderr, user_errors
from tracecal.workload.config import WorkloadConfig

_D = WorkloadConfig()

app = typer.Typer(
    help="The reference training workload: real multi-rank PP/TP/DP traces on any machine (see docs/workload.md).",
    no_args_is_help=True,
)


@app.command("run")
def run(
    out: Annotated[Path, typer.Option("--out", help="Run directory to create (rank traces + run.json).")],
    pp: Annotated[int, typer.Option(help="Pipeline stages (1F1B schedule).")] = _D.pp,
    tp: Annotated[int, typer.Option(help="Tensor-parallel ranks per stage.")] = _D.tp,
    dp: Annotated[int, typer.Option(help="Data-parallel replicas.")] = _D.dp,
    layers: Annotated[int, typer.Option(help="Transformer blocks (divisible by --pp).")] = _D.layers,
    hidden: Annotated[int, typer.Option(help="Model width.")] = _D.hidden,
    heads: Annotated[int, typer.Option(help="Attention heads (divisible by --tp).")] = _D.heads,
    seq: Annotated[int, typer.Option(help="Sequence length.")] = _D.seq,
    vocab: Annotated[int, typer.Option(help="Vocabulary size.")] = _D.vocab,
    micro_batches: Annotated[int, typer.Option(help="Micro-batches per step on each DP rank.")] = _D.micro_batches,
    micro_batch_size: Annotated[int, typer.Option(help="Samples per micro-batch.")] = _D.micro_batch_size,
    steps: Annotated[int, typer.Option(help="Training steps (iterations).")] = _D.steps,
    profile_wait: Annotated[int, typer.Option(help="Steps before the profiler warms up.")] = _D.profile_wait,
    profile_warmup: Annotated[int, typer.Option(help="Profiler warm-up steps (not recorded).")] = _D.profile_warmup,
    bucket_bytes: Annotated[int, typer.Option(help="Cap of one DP gradient all-reduce bucket.")] = _D.bucket_bytes,
    dtype: Annotated[str, typer.Option(help="float32, or bfloat16 (autocast).")] = _D.dtype,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda (local ranks use cuda:RANK).")] = _D.device,
    seed: Annotated[int, typer.Option(help="Seed of weights and data.")] = _D.seed,
    model: Annotated[str, typer.Option(help="Model name recorded in run.json.")] = _D.model,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Stop every rank after this long.")] = _D.timeout_s,
    vocab_parallel: Annotated[
        bool, typer.Option("--vocab-parallel", help="Split embedding, LM head and cross-entropy over TP ranks.")
    ] = _D.vocab_parallel,
    threads: Annotated[
        int, typer.Option(help="CPU threads per rank; 0: cores // ranks (1 can be faster on a busy machine).")
    ] = _D.threads,
    force: Annotated[bool, typer.Option("--force", help="Replace a run already in --out.")] = False,
) -> None:
    """Spawn pp*tp*dp ranks on this machine (gloo on CPU), train, and write one torch.profiler trace
    per rank (OUT/rank{R}.pt.trace.json.gz) plus OUT/run.json. On a cluster use
    `torchrun ... -m tracecal.workload` with the same options instead."""
    from tracecal.api import Session

    with user_errors():
        cfg = WorkloadConfig(
            pp=pp,
            tp=tp,
            dp=dp,
            layers=layers,
            hidden=hidden,
            heads=heads,
            seq=seq,
            vocab=vocab,
            micro_batches=micro_batches,
            micro_batch_size=micro_batch_size,
            steps=steps,
            profile_wait=profile_wait,
            profile_warmup=profile_warmup,
            bucket_bytes=bucket_bytes,
            dtype=dtype,
            device=device,
            seed=seed,
            model=model,
            timeout_s=timeout_s,
            threads=threads,
            vocab_parallel=vocab_parallel,
        ).validate()
        if stderr.is_terminal:
            stderr.print(f"training {cfg.world_size} ranks (pp={pp} tp={tp} dp={dp}) into {out} ...")
        result = Session().workload_run(out, cfg, force=force)
    meta = result.run
    losses = meta["losses"]
    profiled = meta["profile"]["profiled_steps"]
    # Plain lines, not a table: the run path must stay whole for copy-paste into trace-ingest.
    typer.echo(f"{result.out_dir}")
    typer.echo(
        f"  {meta['world_size']} ranks (pp={meta['pp']} tp={meta['tp']} dp={meta['dp']}, {meta['backend']} on "
        f"{meta['device']}), {len(profiled)} profiled steps (ProfilerStep#{profiled[0]}..#{profiled[-1]})"
    )
    typer.echo(
        f"  loss {losses[0]:.4f} -> {losses[-1]:.4f}; training {meta['train_seconds']:.1f} s, "
        f"wall {result.wall_seconds:.1f} s"
    )

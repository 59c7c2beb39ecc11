"""Launching the communication sampler: local gloo ranks, or the ranks of a torchrun job.

- ``spawn_local(settings, world_size)``: fork ``world_size`` gloo processes on this host (CPU, CI,
  ``tracecal samples measure comm``) and return rank 0's rows;
- ``run_distributed(settings, backend, stored=, write=)``: join the launcher's process group (torchrun
  sets RANK, WORLD_SIZE, MASTER_ADDR), sample, and hand rank 0's rows to the caller's ``write`` (the
  API stores them in its session's database, ``api.sampling.measure_comm``);
- ``main(argv)``: the ``python -m tracecal.samplers.comm`` entry point (argparse, one line on stderr):
  rank 0 writes a Parquet ``--output`` (``tracecal samples import`` loads it). Under torchrun,
  ``tracecal samples measure comm --db DB`` writes to a database instead, through the API.

Nothing here opens a database: the samples already kept and where new ones go come from the caller.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracecal.errors import SampleError
from tracecal.samplers.comm import COLLECTIVES, CommSettings, load_comm_config, parse_size, run_rank
from tracecal.schema import SAMPLES, arrow_schema
from tracecal.workload.launch import free_port

# --- local spawn (CPU, CI) -------------------------------------------------------------------------


def _spawned_rank(rank: int, world: int, port: int, settings: CommSettings, skip: frozenset[str], out: str) -> None:
    import pyarrow.parquet as pq
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)  # world_size processes share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(minutes=10))
    try:
        table = run_rank(settings, skip)
        if table is not None:
            pq.write_table(table, out)
    finally:
        dist.destroy_process_group()


def spawn_local(settings: CommSettings, world_size: int, skip_ids: frozenset[str] = frozenset()) -> pa.Table:
    """Run the sampler in ``world_size`` local gloo processes; return rank 0's rows.

    Raises:
        SampleError: bad settings, world size below 2, or a rank failed (its first error line).
    """
    import pyarrow.parquet as pq
    import torch.multiprocessing as mp

    settings.check()
    if world_size < 2:
        raise SampleError(f"--world-size must be at least 2 for collectives (got {world_size})")
    with tempfile.TemporaryDirectory(prefix="tracecal-comm-") as tmp:
        out = str(Path(tmp) / "rank0.parquet")
        try:
            mp.start_processes(
                _spawned_rank,
                args=(world_size, free_port(), settings, skip_ids, out),
                nprocs=world_size,
                join=True,
                # fork: the ranks inherit the imported torch instead of importing it again (seconds
                # per rank); spawn where fork does not exist.
                start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn",
            )
        except mp.ProcessRaisedException as exc:
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            raise SampleError(f"a comm sampler rank failed: {lines[-1] if lines else exc}") from exc
        except mp.ProcessExitedException as exc:
            raise SampleError(f"a comm sampler rank died: {exc}") from exc
        return pq.read_table(out) if Path(out).exists() else pa.Table.from_pylist([], schema=arrow_schema(SAMPLES))


# --- torchrun entry point --------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tracecal.samplers.comm",
        description="Sample collectives under torchrun (NCCL on GPUs, gloo on CPUs); rank 0 stores the samples.",
    )
    parser.add_argument("--cluster", required=True, help="cluster the samples belong to")
    parser.add_argument("--config", help="comm config YAML (path or shipped name, e.g. comm-sweep)")
    parser.add_argument("--sizes", help="comma-separated sizes in bytes (64K, 1M, ...); overrides the config")
    parser.add_argument("--collectives", help=f"comma-separated subset of {','.join(COLLECTIVES)}")
    parser.add_argument("--groups", help="comma-separated groups: world, node:G, cross-node (default: world)")
    parser.add_argument("--dtype", help="float32, float16 or bfloat16 (default: float16 on GPU, float32 on CPU)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--backend", choices=["nccl", "gloo"], help="default: nccl when CUDA is available")
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        help="Parquet file rank 0 writes (load with `tracecal samples import`; to write a database under "
        "torchrun, launch `tracecal samples measure comm --db DB` instead)",
    )
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace, cuda: bool) -> CommSettings:
    """CommSettings from the entry point's arguments (config first, flags override)."""
    base = load_comm_config(args.config, args.cluster) if args.config else CommSettings(cluster=args.cluster)
    changes: dict[str, Any] = {}
    if args.sizes:
        changes["sizes_bytes"] = tuple(parse_size(s) for s in args.sizes.split(","))
    if args.collectives:
        changes["collectives"] = tuple(c.strip() for c in args.collectives.split(","))
    if getattr(args, "groups", None):
        changes["groups"] = tuple(g.strip() for g in args.groups.split(","))
    if args.dtype or not args.config:
        changes["dtype"] = args.dtype or ("float16" if cuda else "float32")
    for key in ("repeats", "warmup"):
        if getattr(args, key) is not None:
            changes[key] = getattr(args, key)
    settings = CommSettings(**{**base.__dict__, **changes})
    settings.check()
    return settings


def under_torchrun() -> bool:
    """True when this process is one rank of a torchrun/torch.distributed launch."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def run_distributed(
    settings: CommSettings,
    backend: str,
    *,
    stored: Callable[[], frozenset[str]],
    write: Callable[[pa.Table], int],
) -> int | None:
    """Join the launcher's process group, sample, and on rank 0 hand the rows to ``write``.

    Rank 0 asks ``stored()`` which sample ids are already kept (resume) and tells the other ranks;
    only rank 0 calls either. Returns what ``write`` returned on rank 0, None on other ranks.
    """
    import torch.distributed as dist

    settings.check()
    if backend == "nccl":  # bind this rank to its GPU before NCCL creates its communicator
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        skip: list[Any] = [stored() if dist.get_rank() == 0 else frozenset()]
        dist.broadcast_object_list(skip, src=0)
        table = run_rank(settings, skip[0])
    finally:
        dist.destroy_process_group()
    return None if table is None else write(table)


def main(argv: Sequence[str] | None = None) -> int:
    """torchrun entry point: every rank samples, rank 0 writes ``--output``."""
    import torch

    from tracecal.sql.samples import write_samples_parquet

    args = _parse_args(argv)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    try:
        settings = settings_from_args(args, backend == "nccl")
        written = run_distributed(
            settings, backend, stored=frozenset, write=lambda table: write_samples_parquet(table, args.output)
        )
    except SampleError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if written is not None:
        sys.stderr.write(f"{written} comm samples written to {args.output} (cluster {settings.cluster})\n")
    return 0

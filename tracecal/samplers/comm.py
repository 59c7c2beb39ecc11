"""The communication sampler: collectives and point-to-point transfers over torch.distributed.

Run it on a cluster under torchrun (NCCL on GPUs, gloo on CPUs), rank 0 storing the samples through the
API, or writing a Parquet file::

    torchrun --nnodes 2 --nproc-per-node 4 -m tracecal.cli.main samples measure comm --cluster perlmutter \\
        --config comm-sweep --db tracecal.duckdb
    torchrun --nnodes 2 --nproc-per-node 4 -m tracecal.samplers.comm --cluster perlmutter \\
        --config comm-sweep --output samples.parquet

or on one machine without torchrun: ``comm_launch.spawn_local(settings, world_size)`` (``tracecal samples
measure comm``) forks ``world_size`` gloo processes on localhost. This module samples; ``comm_launch`` starts ranks.

Timing (docs/samples.md#sampling-on-this-machine): for every (collective, size) each rank runs
``warmup`` untimed calls, then for each repeat all ranks meet at a barrier and time one call (CUDA
events on GPU, ``perf_counter_ns`` on CPU). The per-repeat durations are all-reduced with MAX, so
repeat *i* is the slowest rank's time of call *i*; median, min and IQR over repeats are the sample.
Rank 0 returns/writes the rows.

Sizes follow nccl-tests: ``size_bytes`` is the buffer of all_reduce/broadcast, the *total* (gathered)
buffer for all_gather, the total input for reduce_scatter and all_to_all, and the message for
send/recv (rank 0 sends to the last rank, so multi-node jobs measure an inter-node transfer). Sizes
are rounded down to whole elements per rank; the stored ``size_bytes`` is the size actually moved.

Groups (``groups``): ``world`` runs on all ranks, ``nodes = WORLD_SIZE // LOCAL_WORLD_SIZE`` and
``gpus_per_node = LOCAL_WORLD_SIZE`` (processes per node on CPU); ``node:G`` runs every block of G
consecutive ranks inside a node at once (``nodes`` 1, ``gpus_per_node`` G, like tensor-parallel
groups); ``cross-node`` runs the groups of ranks sharing a local rank across nodes at once (``nodes``
N, ``gpus_per_node`` 1, like data-parallel groups). ``group_size`` is the group's size; the barrier
and the MAX reduction span all ranks.

The GPU path (NCCL, CUDA events, per-rank devices) is written for clusters and was not run on the
CPU-only machine this project is built on.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from tracecal.errors import SampleError
from tracecal.samplers.grid import CONFIG_DIR, dim_values
from tracecal.samplers.rows import SOURCE, sample_row
from tracecal.samplers.timing import SamplerEnv, cpu_name
from tracecal.schema import SAMPLES, arrow_schema
from tracecal.sql.samples import sample_id

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send")
"""Collectives the sampler runs; ``send`` is a rank-0 → last-rank send/recv pair (stored as ``send``,
the name of the sending side in the ``collectives`` table)."""

ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class CommSettings:
    """What to sample: collectives × sizes (bytes, nccl-tests convention), dtype, repeats."""

    cluster: str
    collectives: tuple[str, ...] = COLLECTIVES
    sizes_bytes: tuple[int, ...] = (1 << 10, 1 << 16, 1 << 20)
    dtype: str = "float32"
    warmup: int = 3
    repeats: int = 10
    source_file: str | None = None
    groups: tuple[str, ...] = ("world",)
    """Process groups to sample: ``world``; ``node:G`` (blocks of G consecutive ranks inside each node,
    all blocks running at once, like tensor-parallel groups); ``cross-node`` (the ranks with the same
    local rank on every node, like data-parallel groups across nodes)."""

    def check(self) -> None:
        """Raises SampleError on an unknown collective, group or dtype, or non-positive sizes/repeats."""
        bad = [c for c in self.collectives if c not in COLLECTIVES]
        if bad:
            raise SampleError(f"unknown collective {bad[0]!r}; known: {', '.join(COLLECTIVES)}")
        for g in self.groups:
            size = g.removeprefix("node:")
            if g not in ("world", "cross-node") and not (g.startswith("node:") and size.isdigit() and int(size) >= 2):
                raise SampleError(f"unknown group {g!r}; use world, cross-node or node:G with G ≥ 2")
        if self.dtype not in ELEMENT_BYTES:
            raise SampleError(f"dtype {self.dtype!r} is not one of {', '.join(ELEMENT_BYTES)}")
        if not self.sizes_bytes or min(self.sizes_bytes) < 1:
            raise SampleError("--sizes must be positive byte counts")
        if self.repeats < 1 or self.warmup < 0:
            raise SampleError(f"need --repeats ≥ 1 and --warmup ≥ 0 (got {self.repeats}, {self.warmup})")


@dataclass(frozen=True)
class Topology:
    """Where a group's ranks are: its size, the nodes it spans and its processes (GPUs) per node."""

    group_size: int
    nodes: int
    gpus_per_node: int


def parse_size(text: str) -> int:
    """``4096``, ``64K``, ``1M``, ``1G`` (binary multiples, like nccl-tests) -> bytes."""
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if scale != 1 else text
    try:
        value = int(digits) * scale
    except ValueError:
        raise SampleError(f"size {text!r} is not a byte count (e.g. 4096, 64K, 1M, 1G)") from None
    if value < 1:
        raise SampleError(f"size {text!r} must be positive")
    return value


def load_comm_config(config: str | Path, cluster: str) -> CommSettings:
    """Read a comm config (path, or a shipped ``comm-*`` name)::

    collectives: [all_reduce, all_gather]
    sizes: {start: 1024, end: 1073741824, step: 2, scale: mul}   # or a list of byte counts
    dtype: float16
    warmup: 5
    repeats: 20
    """
    path = Path(config)
    if not path.is_file():
        path = CONFIG_DIR / f"{config}.yml"
    if not path.is_file():
        shipped = sorted(p.stem for p in CONFIG_DIR.glob("comm-*.yml"))
        raise SampleError(f"no comm config {config} and no shipped one of that name; shipped: {', '.join(shipped)}")
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SampleError(f"{path}: not a readable YAML comm config ({str(exc).splitlines()[0]})") from exc
    if not isinstance(doc, dict) or "sizes" not in doc:
        raise SampleError(f"{path}: a comm config needs 'sizes:' (and optionally collectives, dtype, repeats)")
    sizes = dim_values(doc["sizes"], f"{path}: sizes")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes):
        raise SampleError(f"{path}: sizes must be integers (bytes)")
    settings = CommSettings(
        cluster=cluster,
        collectives=tuple(doc.get("collectives", COLLECTIVES)),
        sizes_bytes=tuple(int(s) for s in sizes),
        dtype=str(doc.get("dtype", "float32")),
        warmup=int(doc.get("warmup", 3)),
        repeats=int(doc.get("repeats", 10)),
        source_file=str(path),
        groups=tuple(doc.get("groups", ("world",))),
    )
    settings.check()
    return settings


def plan(settings: CommSettings, world_size: int) -> list[tuple[str, int]]:
    """(collective, size_bytes actually moved) pairs, in order, rounded to whole elements per rank.

    Sizes too small to give every rank one element are dropped; duplicates after rounding kept once.
    """
    es = ELEMENT_BYTES[settings.dtype]
    out: dict[tuple[str, int], None] = {}
    for coll in settings.collectives:
        for size in settings.sizes_bytes:
            elements = size // es
            if coll in ("all_gather", "reduce_scatter", "all_to_all"):
                elements -= elements % world_size
            if elements < (world_size if coll in ("all_gather", "reduce_scatter", "all_to_all") else 1):
                continue
            out[(coll, elements * es)] = None
    return list(out)


def comm_sample_id(
    cluster: str, coll: str, size: int, dtype: str, topo: Topology, device_name: str, backend: str
) -> str:
    """``sample_id`` of one comm point."""
    features = {
        "collective": coll,
        "size_bytes": size,
        "dtype": dtype,
        "group_size": topo.group_size,
        "nodes": topo.nodes,
        "gpus_per_node": topo.gpus_per_node,
        "device_name": device_name,
        "backend": backend,
    }
    return sample_id(cluster, SOURCE, coll, "fwd", features)


def _collective_call(
    dist: Any, torch: Any, coll: str, size: int, dtype: Any, es: int, device: Any, group: Any, members: list[int]
) -> Callable[[], Any]:
    """A closure running one call of ``coll`` moving ``size`` bytes (nccl-tests convention) in
    ``group`` (None = WORLD), whose global ranks are ``members``."""
    rank, width = dist.get_rank(), len(members)
    n = size // es
    if coll == "all_reduce":
        buf = torch.ones(n, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf, group=group)
    if coll == "broadcast":
        buf = torch.ones(n, dtype=dtype, device=device)
        return lambda: dist.broadcast(buf, src=members[0], group=group)
    if coll == "all_gather":
        out, inp = torch.empty(n, dtype=dtype, device=device), torch.ones(n // width, dtype=dtype, device=device)
        # all_gather_into_tensor is deprecated in favour of all_gather_single (torch ≥ 2.9)
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: all_gather(out, inp, group=group)
    if coll == "reduce_scatter":
        inp, out = torch.ones(n, dtype=dtype, device=device), torch.empty(n // width, dtype=dtype, device=device)
        # reduce_scatter_tensor is deprecated in favour of reduce_scatter_single (torch ≥ 2.9)
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: reduce_scatter(out, inp, group=group)
    if coll == "all_to_all":
        inp, out = torch.ones(n, dtype=dtype, device=device), torch.empty(n, dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    # send: the group's first rank -> its last; everyone else idles (and reports 0, which MAX ignores)
    buf = torch.ones(n, dtype=dtype, device=device)
    first, last = members[0], members[-1]
    if rank == first:
        return lambda: dist.send(buf, dst=last, group=group)
    if rank == last:
        return lambda: dist.recv(buf, src=first, group=group)
    return lambda: None


def make_group(dist: Any, spec: str, world: int, local_world: int) -> tuple[Any, list[int], Topology, int] | None:
    """(this rank's group, its members, its topology, groups running at once) for a group spec, or
    None when the spec does not fit the job (e.g. cross-node on one node). Every rank must call it
    with the same spec: creating groups is collective."""
    nodes = max(1, world // local_world)
    if spec == "world":
        return None, list(range(world)), Topology(world, nodes, local_world), 1
    if spec == "cross-node":
        if nodes < 2:
            return None
        blocks = [[node * local_world + local for node in range(nodes)] for local in range(local_world)]
        topo = Topology(nodes, nodes, 1)
    else:
        width = int(spec.removeprefix("node:"))
        if width > local_world or local_world % width:
            return None
        blocks = [list(range(start, start + width)) for start in range(0, world, width)]
        topo = Topology(width, 1, width)
    handles = [dist.new_group(block) for block in blocks]
    rank = dist.get_rank()
    mine = next(i for i, block in enumerate(blocks) if rank in block)
    return handles[mine], blocks[mine], topo, len(blocks)


def run_rank(settings: CommSettings, skip_ids: frozenset[str] = frozenset()) -> pa.Table | None:
    """Sample every planned point on this rank of an initialised process group.

    Every rank must call it with the same settings. Returns the sample rows (``samples`` schema) on
    rank 0 and None elsewhere. Points whose id is in ``skip_ids`` are not run (resume).
    """
    import torch
    import torch.distributed as dist

    settings.check()
    backend = str(dist.get_backend())
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cuda = backend == "nccl"
    if cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", rank % local_world))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        device_name = torch.cuda.get_device_name(device)
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    else:
        device, device_name, nccl = torch.device("cpu"), cpu_name(), None
    # every rank must skip the same points: ids use rank 0's device name
    names = [device_name]
    dist.broadcast_object_list(names, src=0)
    device_name = names[0]
    env = SamplerEnv(device_name, socket.gethostname(), torch.__version__, torch.version.cuda if cuda else None, nccl)
    dtype, es = getattr(torch, settings.dtype), ELEMENT_BYTES[settings.dtype]
    rows: list[dict[str, Any]] = []
    seen: set[Topology] = set()
    for spec in settings.groups:
        made = make_group(dist, spec, world, local_world)
        if made is None or made[2] in seen:  # does not fit the job, or the same as a group already run
            continue
        group, members, topo, concurrent = made
        seen.add(topo)
        for coll, size in plan(settings, len(members)):
            sid = comm_sample_id(settings.cluster, coll, size, settings.dtype, topo, device_name, backend)
            if sid in skip_ids:
                continue
            call = _collective_call(dist, torch, coll, size, dtype, es, device, group, members)
            durations = time_aligned(dist, torch, call, settings, device, cuda)
            if rank == 0:
                facts: dict[str, Any] = {"group": spec, "concurrent_groups": concurrent, "world_size": world}
                if coll == "send":
                    facts.update(src=members[0], dst=members[-1])
                rows.append(_row(settings, coll, size, sid, topo, durations, env, backend, facts))
            del call
    if rank != 0:
        return None
    return pa.Table.from_pylist(rows, schema=arrow_schema(SAMPLES))


def time_aligned(
    dist: Any, torch: Any, call: Callable[[], Any], s: CommSettings, device: Any, cuda: bool
) -> list[float]:
    """Time ``call`` ``s.repeats`` times after ``s.warmup`` untimed calls, the ranks lined up by a
    barrier before each repeat: per repeat, the duration on the slowest rank, ns. ``dist`` and
    ``torch`` are the modules, passed in so that a test can stand in for the GPU branch."""
    import time

    for _ in range(s.warmup):
        call()
    mine = []
    for _ in range(s.repeats):
        if cuda:
            dist.barrier(device_ids=[device.index])
            torch.cuda.synchronize(device)  # the barrier is itself a kernel: let it finish first
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            mine.append(start.elapsed_time(end) * 1e6)  # ms -> ns
        else:
            dist.barrier()
            t0 = time.perf_counter_ns()
            call()
            mine.append(float(time.perf_counter_ns() - t0))
    slowest = torch.tensor(mine, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return [float(v) for v in slowest.cpu().tolist()]


def _row(
    s: CommSettings,
    coll: str,
    size: int,
    sid: str,
    topo: Topology,
    durations: list[float],
    env: SamplerEnv,
    backend: str,
    facts: dict[str, Any],
) -> dict[str, Any]:
    return sample_row(
        env,
        sample_id=sid,
        cluster=s.cluster,
        family="comm",
        op=coll,
        direction="fwd",
        durations_ns=durations,
        params={"backend": backend, "warmup": s.warmup, **facts},
        source_file=s.source_file,
        columns={
            "dtype": s.dtype,
            "io_bytes": float(size),
            "collective": coll,
            "size_bytes": size,
            "group_size": topo.group_size,
            "nodes": topo.nodes,
            "gpus_per_node": topo.gpus_per_node,
        },
    )


if __name__ == "__main__":
    from tracecal.samplers.comm_launch import main

    sys.exit(main())

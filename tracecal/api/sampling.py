"""The steps of `tracecal samples measure compute|comm`: time the points of a plan (`Session.samples_plan`)
or a size sweep, store the samples and re-flag the cluster's samples together (docs/samples.md).
`Session` methods call these."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from tracecal.api.session import Session
    from tracecal.samplers.compute import ComputeReport, ComputeSettings
    from tracecal.samplers.plan import ComputePlan


@dataclass(frozen=True)
class ComputeSampling:
    """What `samples measure compute` did. ``pending``: with ``dry_run``, the points left to time per
    (family, direction), and ``report`` is None; ``flags``: the cluster's samples flagged per reason
    after the new ones were written (empty when nothing was written)."""

    plan: ComputePlan
    settings: ComputeSettings
    report: ComputeReport | None
    pending: dict[tuple[str, str], int] | None
    flags: dict[str, int]


@dataclass(frozen=True)
class CommSampling:
    """What `samples measure comm` did: samples written (None on a torchrun rank other than 0, which
    writes nothing), the gloo ranks spawned here (None under torchrun), the collectives and sizes
    swept, and the cluster's samples flagged per reason afterwards."""

    written: int | None
    world_size: int | None
    collectives: int
    sizes: int
    flags: dict[str, int]


def measure_compute(
    session: Session,
    cluster: str,
    plan: ComputePlan,
    *,
    device: str = "cpu",
    repeats: int | None = None,
    warmup: int | None = None,
    threads: int | None = None,
    timing: str | None = None,
    passes: int = 1,
    processes: int = 1,
    dry_run: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> ComputeSampling:
    """Time ``plan``'s points not yet stored for ``cluster``, store them and re-flag the cluster."""
    from tracecal.samplers.compute import ComputeSettings, pending, sample_compute

    defaults = ComputeSettings(cluster=cluster)
    settings = ComputeSettings(
        cluster=cluster,
        device=device,
        warmup=defaults.warmup if warmup is None else warmup,
        repeats=defaults.repeats if repeats is None else repeats,
        source_file=plan.source,
        threads=threads if threads is not None else defaults.threads,
        autograd=plan.autograd,
        timing=timing,
        passes=passes,
        processes=processes,
    )
    with session.connect() as con:
        if dry_run:
            todo = pending(con, plan.points, settings)
            counts = Counter((p.family, p.direction) for p, _ in todo)
            return ComputeSampling(plan, settings, None, dict(sorted(counts.items())), {})
        report = sample_compute(con, plan.points, settings, progress=progress, extra_params=plan.params_for)
        flags = _reflag(con, cluster) if report.written else {}
    return ComputeSampling(plan, settings, report, None, flags)


def measure_comm(
    session: Session,
    cluster: str,
    *,
    world_size: int = 2,
    config: str | None = None,
    sizes: str | None = None,
    collectives: str | None = None,
    dtype: str | None = None,
    groups: str | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
) -> CommSampling:
    """Time collectives and send/recv over a size sweep: ``world_size`` local gloo processes, or, when
    this process is a torchrun rank, the launcher's process group (rank 0 writes)."""
    import argparse

    from tracecal.samplers import comm_launch as sampler

    args = argparse.Namespace(
        cluster=cluster, config=config, sizes=sizes, collectives=collectives,
        dtype=dtype, repeats=repeats, warmup=warmup, groups=groups,
    )  # fmt: skip
    flags: dict[str, int] = {}

    def stored() -> frozenset[str]:
        from tracecal.sql.samples import existing_sample_ids

        if not session.db_path.exists():  # a torchrun job's first sweep: nothing to resume
            return frozenset()
        with session.connect(read_only=True) as con:
            return frozenset(existing_sample_ids(con, cluster))

    def write(table: pa.Table) -> int:
        from tracecal.sql.samples import write_samples

        with session.connect() as con:
            written = write_samples(con, table, origin="comm sampler")
            flags.update(_reflag(con, cluster) if written else {})
        return written

    if sampler.under_torchrun():
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        run = sampler.settings_from_args(args, backend == "nccl")
        # a torchrun rank joins the launcher's group; rank 0 alone reads and writes the database
        written = sampler.run_distributed(run, backend, stored=stored, write=write)
        return CommSampling(written, None, len(run.collectives), len(run.sizes_bytes), flags)
    run = sampler.settings_from_args(args, cuda=False)
    written = write(sampler.spawn_local(run, world_size, stored()))
    return CommSampling(written, world_size, len(run.collectives), len(run.sizes_bytes), flags)


def under_torchrun() -> bool:
    """Whether this process is one rank of a torchrun launch (`measure_comm` then joins its group)."""
    from tracecal.samplers.comm_launch import under_torchrun as launched

    return launched()


def _reflag(con: duckdb.DuckDBPyConnection, cluster: str) -> dict[str, int]:
    """Judge the new samples together with the cluster's others (docs/samples.md#quality-flags)."""
    from tracecal.samplers.quality import reflag_cluster

    return reflag_cluster(con, cluster)

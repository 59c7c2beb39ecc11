"""`tracecal samples measure compute|comm`: run microbenchmarks and store the samples.

The old spellings `tracecal sample compute|comm` stay for one release as a hidden group
(``legacy_app``) that warns and runs the same commands.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer

from tracecal.cli.common import DbOption, progress_bar, render_rows, stdout, user_errors, warn

app = typer.Typer(
    help="Run microbenchmarks (GPU, or CPU where there is none) and store samples for a cluster.",
    no_args_is_help=True,
)

ClusterOption = Annotated[str, typer.Option("--cluster", help="Cluster the samples belong to (e.g. perlmutter).")]
RepeatsOption = Annotated[int | None, typer.Option("--repeats", min=1, help="Timed repeats per point.")]
WarmupOption = Annotated[int | None, typer.Option("--warmup", min=0, help="Untimed calls before timing.")]


@app.command("compute")
def compute(
    cluster: ClusterOption,
    config: Annotated[
        str | None, typer.Option("--config", help="Grid YAML: a path, or a shipped name (ci, gpt-small, ...).")
    ] = None,
    from_run: Annotated[
        str | None, typer.Option("--from-run", help="Sample exactly the compute calls of this ingested run.")
    ] = None,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N.")] = "cpu",
    dtype: Annotated[
        list[str] | None, typer.Option("--dtype", help="float32, float16, bfloat16 (repeatable); overrides the grid.")
    ] = None,
    family: Annotated[
        list[str] | None, typer.Option("--family", help="Only these families (repeatable): gemm, attention, ...")
    ] = None,
    parts: Annotated[int, typer.Option("--parts", min=1, help="Split the points into N parts ...")] = 1,
    part: Annotated[int, typer.Option("--part", min=1, help="... and run part K (1-based).")] = 1,
    repeats: RepeatsOption = None,
    warmup: WarmupOption = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="CPU: torch threads while sampling (default 1).")
    ] = None,
    timing: Annotated[
        str | None,
        typer.Option(
            "--timing",
            help="CPU: perf_counter (default), or profiler (each repeat's own torch.profiler events, as a "
            "CPU trace measures an operator; about twice the sampling time). CUDA: cuda_burst (default; "
            "back-to-back calls, launch overhead hidden and fixed costs subtracted), profiler (the kernels' "
            "durations, as a GPU trace measures them) or cuda_events (one call between events). "
            "docs/samples.md#timing.",
        ),
    ] = None,
    passes: Annotated[
        int,
        typer.Option(
            "--passes",
            min=1,
            help="Sweeps over all points, each timing --repeats calls per point (spreads "
            "a point's repeats over the run, so a burst of load disturbs one pass, not every repeat).",
        ),
    ] = 1,
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            min=1,
            help="CPU: concurrent sampler processes; set it to the ranks the modelled "
            "workload ran on one node (samples then carry their contention; recorded in each sample).",
        ),
    ] = 1,
    inference: Annotated[
        bool, typer.Option("--inference", help="Forward calls without autograd (default: as in training).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count the points to sample per family and direction.")
    ] = False,
    plan_only: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="Print the points and, with --from-run, the share of the run's operator time they cover; "
            "time nothing (any machine).",
        ),
    ] = False,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact", help="--from-run: only the traced shapes, not their neighbourhood (too few to calibrate)."
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Time compute operators over a grid or the shapes of a run, forward and backward, and store the
    samples. Resumable: points already stored for the cluster are skipped."""
    from tracecal.api import Session

    with user_errors():
        session = Session(db)
        plan = session.samples_plan(
            config=config, from_run=from_run, dtypes=dtype, families=family, parts=parts, part=part,
            inference=inference, exact=exact,
        )  # fmt: skip
        if plan_only:
            _print_plan(plan)
            return
        for (op, reason), count in sorted(plan.unmapped.items()):
            warn(f"{from_run}: {count} distinct {op} call(s) not sampled: {reason}")
        if plan.run is not None:
            _print_coverage(plan.run)
        options: dict[str, Any] = dict(
            device=device, repeats=repeats, warmup=warmup, threads=threads, timing=timing, passes=passes,
            processes=processes,
        )  # fmt: skip
        if dry_run:
            counted = session.samples_measure_compute(cluster, plan, dry_run=True, **options)
            render_rows(
                f"{cluster}: {sum((counted.pending or {}).values())} points to sample ({plan.source})",
                ["family", "direction", "points"],
                [(f, d, n) for (f, d), n in (counted.pending or {}).items()],
            )
            return
        with progress_bar() as bar:
            task = bar.add_task("sampling", total=None)

            def progress(done: int, total: int, label: str) -> None:
                bar.update(task, completed=done, total=total, description=label)

            result = session.samples_measure_compute(cluster, plan, progress=progress, **options)
        report = result.report
        assert report is not None
        stdout.print(
            f"{cluster}: {report.planned} points, {report.already_stored} already stored, "
            f"{report.written} written, {len(report.skipped)} skipped in {report.seconds:.1f} s "
            f"(device {device}, {passes} pass(es), {processes} process(es), database {session.db_path})"
        )
        if report.skipped:
            render_rows("skipped points", ["reason", "points"], sorted(report.skipped_reasons().items()))
        _print_flags(cluster, result.flags)


@app.command("comm")
def comm(
    cluster: ClusterOption,
    world_size: Annotated[
        int, typer.Option("--world-size", min=2, help="Local gloo processes to spawn (ignored under torchrun).")
    ] = 2,
    config: Annotated[
        str | None, typer.Option("--config", help="Comm config YAML: a path, or comm-ci / comm-sweep.")
    ] = None,
    sizes: Annotated[
        str | None, typer.Option("--sizes", help="Comma-separated sizes in bytes: 4096,64K,1M (nccl-tests S).")
    ] = None,
    collectives: Annotated[
        str | None, typer.Option("--collectives", help="Comma-separated subset of all_reduce,all_gather,...")
    ] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="float32 (CPU default), float16, bfloat16.")] = None,
    groups: Annotated[
        str | None,
        typer.Option("--groups", help="Process groups: world, node:G (G ranks per node), cross-node; comma-separated."),
    ] = None,
    repeats: RepeatsOption = None,
    warmup: WarmupOption = None,
    db: DbOption = None,
) -> None:
    """Time collectives and send/recv over a size sweep; the slowest rank's time is the sample. Spawns
    local gloo processes, or joins the process group when launched by torchrun (rank 0 writes)."""
    from tracecal.api import Session
    from tracecal.api.sampling import under_torchrun

    with user_errors():
        session = Session(db)
        options: dict[str, Any] = dict(
            config=config, sizes=sizes, collectives=collectives, dtype=dtype, groups=groups, repeats=repeats,
            warmup=warmup,
        )  # fmt: skip
        if under_torchrun():
            result = session.samples_measure_comm(cluster, **options)
            if result.written is not None:
                stdout.print(f"{cluster}: {result.written} comm samples written to {session.db_path}")
                _print_flags(cluster, result.flags)
            return
        with progress_bar() as bar:
            bar.add_task(f"{world_size} gloo ranks sampling", total=None)
            result = session.samples_measure_comm(cluster, world_size=world_size, **options)
        stdout.print(
            f"{cluster}: {result.written} comm samples written ({world_size} gloo ranks on this host, "
            f"{result.collectives} collectives × {result.sizes} sizes; database {session.db_path})"
        )
        _print_flags(cluster, result.flags)


def _dims_text(dims: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in dims)


def _print_plan(plan: Any) -> None:
    """The points of a plan; for a run, its traced calls' points with the time each stands for,
    how many neighbours come with them, and the coverage (docs/samples.md#sampling-a-run)."""
    run = plan.run
    if run is None:
        render_rows(
            f"{len(plan.points)} points ({plan.source})",
            ["family", "op", "direction", "dtype", "dims"],
            [(p.family, p.op, p.direction, p.dtype, _dims_text(p.dims)) for p in plan.points],
        )
        return
    traced = [p for p in run.points if p in set(plan.points)]
    total = run.total_ns or 1
    render_rows(
        f"{run.run_id}: {len(traced)} traced calls, {len(plan.points) - len(traced)} neighbours, "
        f"{len(plan.points)} points ({plan.source})",
        ["family", "op", "direction", "dtype", "shape", "time %"],
        [
            (
                p.family,
                p.op,
                p.direction,
                p.dtype,
                _dims_text(p.dims),
                round(100 * run.traced[p]["traced_ns"] / total, 2),
            )
            for p in traced
        ],
    )
    _print_coverage(run)


def _print_coverage(run: Any) -> None:
    """``coverage: NN.N % of GPU operator time``, then the uncovered time by operator and reason."""
    if run.coverage is None:
        return
    where = "GPU operator time" if run.gpu else "operator time"
    share = math.floor(1000 * run.coverage) / 10  # rounded down: 99.99 % with a gap is not 100.0 %
    stdout.print(
        f"coverage: {share:.1f} % of {where} ({run.run_id}, best iteration, collectives left to "
        f"`samples measure comm`: {run.covered_ns / 1e6:.2f} of {run.total_ns / 1e6:.2f} ms)",
        highlight=False,
    )
    if run.uncovered:
        render_rows(
            "not covered",
            ["operator", "reason", "ms", "time %"],
            [
                (name, reason, round(ns / 1e6, 3), round(100 * ns / run.total_ns, 3))
                for (name, reason), ns in sorted(run.uncovered.items(), key=lambda kv: -kv[1])
            ],
        )


def _print_flags(cluster: str, flags: dict[str, int]) -> None:
    if flags:
        text = ", ".join(f"{n} {reason}" for reason, n in sorted(flags.items()))
        warn(f"{cluster}: quality flags on the cluster's samples: {text} (see `tracecal samples list`)")


legacy_app = typer.Typer(
    help="Renamed to `tracecal samples measure compute|comm`; this spelling goes in the next release.",
    no_args_is_help=True,
)
legacy_app.command("compute")(compute)
legacy_app.command("comm")(comm)


@legacy_app.callback()
def _renamed() -> None:
    warn("`tracecal sample` is now `tracecal samples measure`; the old spelling goes in the next release")

"""What the compute sampler times, and how: the points of a grid or a run, and the demo's policy.

``compute_plan(con, config=..., from_run=...)`` assembles the points of ``tracecal samples measure
compute``: a grid file's points (``--config``) or the traced calls of an ingested run
(``--from-run``), then the ``--dtype``, ``--family`` and ``--part`` filters. ``neighbourhood`` and
``run_settings`` are how ``tracecal demo`` samples a run it has just traced (docs/samples.md,
docs/workload.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb

from tracecal.errors import SampleError
from tracecal.samplers.compute import ComputeSettings
from tracecal.samplers.from_run import RunPlan, run_points
from tracecal.samplers.grid import GridPoint, load_grid, shard, with_dtypes


@dataclass(frozen=True)
class ComputePlan:
    """The points to sample, where they come from, and how their forward calls are recorded."""

    points: list[GridPoint]
    source: str
    """``samples.source_file``: the grid's file, or ``run:<run_id>``."""
    autograd: bool
    """Forward calls record the autograd graph (training), or run under ``no_grad``."""
    params_for: Callable[[GridPoint], dict[str, Any]] | None = None
    """Per point, what goes to ``params_json`` beside the sampler's own (``--from-run``: the traced ops)."""
    unmapped: dict[tuple[str, str], int] = field(default_factory=dict)
    """``--from-run``: (CPU op, reason) -> distinct traced calls no sampler covers."""
    run: RunPlan | None = None
    """``--from-run``: the traced calls' own points and the operator time they cover."""


def compute_plan(
    con: duckdb.DuckDBPyConnection,
    *,
    config: str | None = None,
    from_run: str | None = None,
    dtypes: Sequence[str] | None = None,
    families: Sequence[str] | None = None,
    parts: int = 1,
    part: int = 1,
    inference: bool = False,
    exact: bool = False,
) -> ComputePlan:
    """The points of a grid (``config``, a path or a shipped name) or of an ingested run
    (``from_run``), with each dtype replaced by ``dtypes`` (a grid) or only calls of ``dtypes`` (a
    run), only ``families``, and part ``part`` of ``parts``. A run's forward calls record autograd
    when the run has a backward phase, whatever ``inference`` says; a grid's unless ``inference``.

    A run's traced shapes come with their ``neighbourhood`` (what calibration needs to fit a model
    per op), or alone with ``exact``.

    Raises:
        SampleError: not exactly one of ``config`` and ``from_run``, a bad grid, a run without compute
            operators, or no points left after the filters.
        RunNotFoundError: ``from_run`` is not in the database.
    """
    if (config is None) == (from_run is None):
        raise SampleError("give exactly one of --config GRID or --from-run RUN")
    dtype_list = list(dtypes) if dtypes else None
    if from_run is not None:
        run = run_points(con, from_run, dtype_list)
        points = run.points if exact else neighbourhood(run.points)
        plan = ComputePlan(points, f"run:{from_run}", run.training, run.params_for, dict(run.unmapped), run)
    else:
        grid = load_grid(config or "")
        plan = ComputePlan(with_dtypes(list(grid.points), dtype_list), grid.source, not inference)
    points = [p for p in plan.points if p.family in families] if families else plan.points
    points = shard(points, parts, part)
    if not points:
        raise SampleError("no points to sample after --family/--dtype/--part filtering")
    return replace(plan, points=points)


NEIGHBOURHOOD_SMALL = (0.5, 0.75, 1.0, 1.5, 2.0)
"""Factors of the full-factorial neighbourhood of a traced shape with at most two dimensions."""
NEIGHBOURHOOD_LARGE = (0.5, 1.0, 2.0)
"""Factors of the full-factorial neighbourhood of a traced shape with three or more dimensions."""


def neighbourhood(points: Sequence[GridPoint]) -> list[GridPoint]:
    """Each traced shape plus a full-factorial neighbourhood of its integer dimensions (pure).

    Calibration fits one regressor per op and direction and wants at least 20 samples each; a small
    run traces only a few shapes per op, so the demo times the traced shapes and their neighbours
    (every dimension scaled by ``NEIGHBOURHOOD_*``), which also lets the models interpolate."""
    out: dict[GridPoint, None] = {}
    for p in points:
        out[p] = None
        names = [k for k, v in p.dims if isinstance(v, int) and not isinstance(v, bool) and v > 1]
        factors = NEIGHBOURHOOD_SMALL if len(names) <= 2 else NEIGHBOURHOOD_LARGE
        for combo in itertools.product(factors, repeat=len(names)):
            scaled = dict(zip(names, combo, strict=True))
            dims = tuple(
                (k, max(1, round(v * scaled[k])) if k in scaled and isinstance(v, int) else v) for k, v in p.dims
            )
            out[replace(p, dims=dims)] = None
    return list(out)


def run_settings(cluster: str, device: str, run_id: str, repeats: int, passes: int, processes: int) -> ComputeSettings:
    """How to sample the shapes of a run traced on this machine: on CPU, as many concurrent samplers
    as the workload had ranks (each traced operator ran while the other ranks competed for the cores,
    caches and memory bandwidth); on a GPU, one sampler (timed by ``timing.default_timing``). On both, the repeats
    of a shape spread over passes, so a burst of load from other jobs disturbs one pass of many
    shapes, not every repeat of a few."""
    cuda = device == "cuda"
    return ComputeSettings(
        cluster=cluster,
        device=device,
        warmup=3 if cuda else 1,  # a GPU's first calls pay for lazy initialisation and autotuning
        repeats=repeats,
        passes=passes,
        source_file=f"run:{run_id}",
        processes=1 if cuda else processes,
        threads=None if cuda else 1,
    )

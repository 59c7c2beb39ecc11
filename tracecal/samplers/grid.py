"""Shape grids for the compute sampler, read from YAML.

A grid file (shipped ones live in ``tracecal/samplers/configs/``; ``--config NAME`` picks one by name)::

    name: gpt-small
    dtypes: [float32, bfloat16]          # default for every sweep
    directions: [fwd, bwd]               # default for every sweep
    sweeps:
      - family: gemm
        ops: [aten::mm, aten::linear]
        dims:
          m: {start: 512, end: 4096, step: 2, scale: mul}   # 512, 1024, 2048, 4096
          n: {start: 768, end: 3072, step: 768}             # additive by default: 768 ... 3072
          k: [768, 1024]                                    # an explicit list
      - family: attention
        ops: [aten::scaled_dot_product_attention]
        dims: {batch: 2, heads: 12, seq: [512, 1024], head_dim: 64, causal: [true, false]}

Every sweep expands to the product of its dimensions (declared order, the last dimension fastest),
times its ops, dtypes and directions. ``expand`` returns the points in a fixed order so that
``--parts N --part K`` (``shard``) gives every point to exactly one part.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tracecal.errors import SampleError

CONFIG_DIR = Path(__file__).parent / "configs"

DimValue = int | float | bool | str


@dataclass(frozen=True)
class GridPoint:
    """One point of a grid: what to run, before any tensor exists."""

    family: str
    op: str
    direction: str
    dtype: str
    dims: tuple[tuple[str, DimValue], ...]

    def dim(self, name: str, default: DimValue | None = None) -> Any:
        for key, value in self.dims:
            if key == name:
                return value
        return default


@dataclass(frozen=True)
class Grid:
    """A parsed grid file."""

    name: str
    source: str
    points: tuple[GridPoint, ...]


def shipped_grids() -> list[str]:
    """Names of the compute grids shipped with tracecal (``--config NAME``; ``comm-*`` are comm configs)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yml") if not p.stem.startswith("comm-"))


def resolve_config(config: str | Path) -> Path:
    """A grid file path: an existing path as given, else a shipped grid of that name.

    Raises:
        SampleError: neither a file nor a shipped grid name.
    """
    path = Path(config)
    if path.is_file():
        return path
    shipped = CONFIG_DIR / f"{config}.yml"
    if shipped.is_file():
        return shipped
    raise SampleError(f"no grid file {config} and no shipped grid of that name; shipped: {', '.join(shipped_grids())}")


def load_grid(config: str | Path) -> Grid:
    """Read and expand a grid file (path or shipped name).

    Raises:
        SampleError: unreadable YAML or a malformed sweep (the message names the file and sweep).
    """
    path = resolve_config(config)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SampleError(f"{path}: not a readable YAML grid ({str(exc).splitlines()[0]})") from exc
    return parse_grid(doc, source=str(path))


def parse_grid(doc: Any, source: str) -> Grid:
    """Expand a grid document (the parsed YAML) into points; ``source`` names it in errors."""
    if not isinstance(doc, dict) or not isinstance(doc.get("sweeps"), list) or not doc["sweeps"]:
        raise SampleError(f"{source}: a grid needs a non-empty 'sweeps:' list")
    dtypes = _str_list(doc.get("dtypes", ["float32"]), source, "dtypes")
    directions = _str_list(doc.get("directions", ["fwd"]), source, "directions")
    points: list[GridPoint] = []
    for i, sweep in enumerate(doc["sweeps"]):
        where = f"{source}: sweep {i + 1}"
        if not isinstance(sweep, dict) or "family" not in sweep or "ops" not in sweep:
            raise SampleError(f"{where}: needs 'family:' and 'ops:'")
        ops = _str_list(sweep["ops"], where, "ops")
        s_dtypes = _str_list(sweep.get("dtypes", dtypes), where, "dtypes")
        s_dirs = _str_list(sweep.get("directions", directions), where, "directions")
        bad = [d for d in s_dirs if d not in ("fwd", "bwd")]
        if bad:
            raise SampleError(f"{where}: direction {bad[0]!r} is not fwd or bwd")
        dims = sweep.get("dims") or {}
        if not isinstance(dims, dict):
            raise SampleError(f"{where}: 'dims:' must map dimension names to values")
        names = list(dims)
        axes = [dim_values(dims[n], f"{where}, dim {n}") for n in names]
        for op, dtype, direction in itertools.product(ops, s_dtypes, s_dirs):
            for combo in itertools.product(*axes):
                points.append(
                    GridPoint(str(sweep["family"]), op, direction, dtype, tuple(zip(names, combo, strict=True)))
                )
    return Grid(str(doc.get("name", Path(source).stem)), source, tuple(points))


def dim_values(spec: Any, where: str) -> list[DimValue]:
    """Values of one dimension: a scalar, a list, or {start, end, step, scale: add|mul}.

    Ranges include ``end`` when a step lands on it; ``mul`` steps multiply (step > 1), ``add`` steps add.
    """
    if isinstance(spec, (bool, int, float, str)):
        return [spec]
    if isinstance(spec, list) and spec and all(isinstance(v, (bool, int, float, str)) for v in spec):
        return list(spec)
    if isinstance(spec, dict) and {"start", "end", "step"} <= set(spec):
        start, end, step = spec["start"], spec["end"], spec["step"]
        scale = spec.get("scale", "add")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step)):
            raise SampleError(f"{where}: start, end and step must be integers")
        if scale not in ("add", "mul"):
            raise SampleError(f"{where}: scale must be add or mul, not {scale!r}")
        if start < 1 or end < start or (scale == "add" and step < 1) or (scale == "mul" and step < 2):
            raise SampleError(f"{where}: need 1 ≤ start ≤ end and step ≥ 1 (add) or ≥ 2 (mul)")
        out: list[DimValue] = []
        value = start
        while value <= end:
            out.append(value)
            value = value + step if scale == "add" else value * step
        return out
    raise SampleError(f"{where}: expected a value, a list, or {{start, end, step[, scale]}}")


def shard(points: Sequence[GridPoint], parts: int, part: int) -> list[GridPoint]:
    """The points of part ``part`` (1-based) of ``parts``: every ``parts``-th point from ``part - 1``.

    Raises:
        SampleError: ``part`` outside 1..``parts``.
    """
    if parts < 1 or not 1 <= part <= parts:
        raise SampleError(f"--part must be between 1 and --parts ({parts}); got {part}")
    return [p for i, p in enumerate(points) if i % parts == part - 1]


def with_dtypes(points: Sequence[GridPoint], dtypes: Sequence[str] | None) -> list[GridPoint]:
    """``points`` with each dtype replaced by every one of ``dtypes`` (``--dtype``), without duplicates;
    ``points`` unchanged when ``dtypes`` is empty."""
    if not dtypes:
        return list(points)
    out = (GridPoint(p.family, p.op, p.direction, d, p.dims) for p in points for d in dtypes)
    return list(dict.fromkeys(out))


def _str_list(value: Any, where: str, key: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, str) for v in items):
        raise SampleError(f"{where}: '{key}:' must be a name or a list of names")
    return list(items)

"""The durations a replay uses: measured, predicted by calibrated models, or scaled per family (what-if).

Only nodes whose duration role is ``own`` take a new duration: operators with their own work (a GEMM,
an optimizer step, an un-matched communication op) and collective instances (their transfer time,
from the communication model). Collective members follow their instance; runtime calls and markers
keep the trace's times. An operator no model covers keeps its measured duration and is counted as
uncovered, never silently. The kernels of an optimizer step (activities carrying
``calibrate.in_trace.STEP_COLUMNS``) are predicted as the whole step the sampler times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import polars as pl

from tracecal.calibrate.in_trace import as_optimizer_steps
from tracecal.errors import PredictionError
from tracecal.predict.graph import ReplayGraph

MODES = ("measured", "predicted", "scaled")
"""Replay modes, as stored in ``predictions.mode`` and ``components.mode``."""


class DurationModel(Protocol):
    """What ``predicted`` needs from calibration: durations for operator and collective rows.

    ``predict(frame)`` receives rows with the ``operators`` columns (family, phase, kind, name and
    the shape features) or, for collective instances, ``family = 'comm'`` with ``collective`` (the
    normalised name), ``size_bytes``, ``group_size``, ``nodes``, ``gpus_per_node``, ``dtype`` and
    ``role``; it returns one duration in ns per row, NaN (or null) where no model covers the row.
    """

    def predict(self, frame: pl.DataFrame) -> Sequence[float] | np.ndarray | pl.Series: ...


@dataclass(frozen=True)
class Durations:
    """One duration per graph node (int64 ns) and where it came from (``measured``, ``model``,
    ``scale``, or ``ratio``: no model on the target cluster, the measured duration times the
    clusters' throughput ratio, see ``what_if``); ``mode`` is the replay mode they make."""

    dur_ns: np.ndarray
    source: np.ndarray
    mode: str


def _own(graph: ReplayGraph) -> np.ndarray:
    return graph.nodes["duration_role"].to_numpy() == "own"


def measured(graph: ReplayGraph) -> Durations:
    """The trace's durations (the fidelity check: the replay then reproduces the trace)."""
    dur = graph.nodes["dur_ns"].to_numpy().astype(np.int64)
    return Durations(dur, np.full(dur.size, "measured", dtype=object), "measured")


def parse_scale(items: Sequence[str]) -> dict[str, float]:
    """``["gemm=0.5", "comm=2"]`` -> ``{"gemm": 0.5, "comm": 2.0}``.

    Raises:
        PredictionError: an item is not ``family=factor`` with a positive finite factor.
    """
    out: dict[str, float] = {}
    for item in items:
        family, sep, value = item.partition("=")
        try:
            factor = float(value)
        except ValueError:
            factor = math.nan
        if not sep or not family or not math.isfinite(factor) or factor < 0:
            raise PredictionError(f"--scale {item!r}: expected FAMILY=FACTOR with a factor >= 0, e.g. gemm=0.5")
        out[family.strip()] = factor
    return out


def scaled(graph: ReplayGraph, factors: Mapping[str, float], base: Durations | None = None) -> Durations:
    """Multiply the durations of ``own`` nodes of each family by its factor (``comm`` scales the
    transfer time of collective instances too).

    Raises:
        PredictionError: a family in ``factors`` occurs nowhere in the iteration.
    """
    base = base or measured(graph)
    family = graph.nodes["family"].fill_null("other").to_numpy()
    own = _own(graph)
    dur = base.dur_ns.copy()
    source = base.source.copy()
    present = set(family[own].tolist())
    unknown = sorted(set(factors) - present)
    if unknown:
        raise PredictionError(
            f"--scale: no operator of family {', '.join(unknown)} in this iteration; families present: "
            + ", ".join(sorted(present))
        )
    for fam, factor in factors.items():
        hit = own & (family == fam)
        dur[hit] = np.rint(dur[hit] * factor).astype(np.int64)
        source[hit] = "scale"
    return Durations(dur, source, "scaled")


def model_rows(graph: ReplayGraph) -> tuple[np.ndarray, pl.DataFrame]:
    """The ``own`` nodes a model may predict and the rows handed to ``DurationModel.predict``."""
    nodes = graph.nodes
    own = _own(graph) & nodes["node_kind"].is_in(["activity", "collective"]).to_numpy()
    idx = np.flatnonzero(own)
    base = nodes[idx].select("node", "rank", "event_id", "node_kind", "kind", "name", "family", "dur_ns", "role")
    feats = graph.features.drop([c for c in graph.features.columns if c in base.columns and c != "node"])
    rows = base.join(feats, on="node", how="left", maintain_order="left") if feats.width > 1 else base
    if "phase" in rows.columns:
        rows = rows.with_columns(pl.col("phase").alias("trace_phase"))
    if "collective" not in rows.columns:
        rows = rows.with_columns(pl.lit(None, pl.String).alias("collective"))
    return idx, rows.with_columns(call_direction_expr(rows))


BACKWARD_OP = r"(?i)backward"
"""Operators that are the autograd backward of a forward op (``aten::gelu_backward``, ...)."""


def call_direction_expr(rows: pl.DataFrame) -> pl.Expr:
    """``phase`` as the duration model must read it: the direction of the *call*, not of the phase
    it ran in. A sample is one call of an op (see docs/samples.md, ``samplers.from_run``): an ``aten::mm`` run
    by ``MmBackward0`` is one mm of its own shape, predicted with the forward samples, while a ``bwd``
    sample is the whole autograd backward of a forward op — what a backward op (``*_backward*``) is.
    The trace's phase is kept as ``trace_phase``."""
    op = pl.coalesce(pl.col("cpu_op_name"), pl.col("name")) if "cpu_op_name" in rows.columns else pl.col("name")
    phase = pl.col("phase") if "phase" in rows.columns else pl.lit(None, pl.String)
    return (
        pl.when(pl.col("family") == "optimizer")
        .then(phase)
        .when(op.str.contains(BACKWARD_OP).fill_null(False))
        .then(pl.lit("bwd"))
        .otherwise(pl.lit("fwd"))
        .alias("phase")
    )


def predicted(graph: ReplayGraph, model: DurationModel, fallback: Mapping[str, float] | None = None) -> Durations:
    """Durations from calibrated models; rows the model leaves NaN keep their measured duration, or,
    when ``fallback`` has a factor for their family (a cross-cluster ratio, ``what_if``), take the
    measured duration times it (source ``ratio``).

    Raises:
        PredictionError: the model returned a different number of rows, or negative durations.
    """
    base = measured(graph)
    idx, rows = model_rows(graph)
    if idx.size == 0:
        return Durations(base.dur_ns, base.source, "predicted")
    # an optimizer step is one call of the whole-step model, its kernels sharing the prediction
    # (split_per_operator), as the in-trace check scores it; what no model covers keeps its node's
    # family for the fallback and the coverage
    calls = as_optimizer_steps(rows)
    raw = model.predict(calls)
    values = raw.to_numpy() if isinstance(raw, pl.Series) else np.asarray(raw, dtype=float)
    values = np.asarray(values, dtype=float)
    if values.shape != (idx.size,):
        raise PredictionError(f"the duration model returned {values.shape} values for {idx.size} operators")
    ok = np.isfinite(values)
    if (values[ok] < 0).any():
        raise PredictionError("the duration model predicted negative durations; recalibrate the cluster")
    values = split_per_operator(calls, values)
    dur = base.dur_ns.copy()
    source = base.source.copy()
    dur[idx[ok]] = np.rint(values[ok]).astype(np.int64)
    source[idx[ok]] = "model"
    if fallback:
        family = rows["family"].fill_null("other").to_list()
        factor = np.array([fallback.get(f, math.nan) for f in family], dtype=float)
        use = ~ok & np.isfinite(factor)
        dur[idx[use]] = np.rint(base.dur_ns[idx[use]] * factor[use]).astype(np.int64)
        source[idx[use]] = "ratio"
    return Durations(dur, source, "predicted")


def split_per_operator(rows: pl.DataFrame, values: np.ndarray) -> np.ndarray:
    """A model predicts one call of an operator, all its kernels together (a sample times the whole
    op): the prediction made for an operator's longest kernel (its main work, whose family routed it)
    is shared by its predicted kernels in proportion to their measured durations, instead of every
    kernel taking a whole call. Rows without a CPU operator stand alone."""
    if "cpu_op_event_id" not in rows.columns:
        return values
    frame = pl.DataFrame(
        {
            "rank": rows["rank"],
            "op": rows["cpu_op_event_id"],
            "dur": rows["dur_ns"].cast(pl.Float64).clip(lower_bound=1.0),
            "value": pl.Series(values, dtype=pl.Float64).fill_nan(None),
        }
    ).with_row_index("_row")
    group = ("rank", "op")
    shared = (
        frame.filter(pl.col("op").is_not_null() & pl.col("value").is_not_null())
        .with_columns(
            pl.len().over(group).alias("_kernels"),
            (
                pl.col("value").sort_by("dur", descending=True).first().over(group)
                * pl.col("dur")
                / pl.col("dur").sum().over(group)
            ).alias("_share"),
        )
        .filter(pl.col("_kernels") > 1)
    )
    if shared.height == 0:
        return values
    out = values.copy()
    out[shared["_row"].to_numpy()] = shared["_share"].to_numpy()
    return out


def measured_share(graph: ReplayGraph, durations: Durations) -> float:
    """Share (0–1) of the measured time of ``own`` activity/collective nodes whose duration was
    carried over as measured (neither a model nor a ratio changed it)."""
    idx, _ = model_rows(graph)
    measured_ns = graph.nodes["dur_ns"].to_numpy()[idx].astype(float)
    kept = durations.source[idx] == "measured"
    return float(measured_ns[kept].sum() / measured_ns.sum()) if measured_ns.sum() else 0.0


def coverage(graph: ReplayGraph, durations: Durations) -> dict[str, float]:
    """Share of the measured time of ``own`` activity/collective nodes whose duration came from a
    model, overall and per family (0–1)."""
    idx, rows = model_rows(graph)
    measured_ns = graph.nodes["dur_ns"].to_numpy()[idx].astype(float)
    covered = durations.source[idx] == "model"
    fam = rows["family"].fill_null("other").to_numpy()
    out = {"all": float(measured_ns[covered].sum() / measured_ns.sum()) if measured_ns.sum() else 0.0}
    for f in sorted(set(fam.tolist())):
        m = fam == f
        total = measured_ns[m].sum()
        out[f] = float(measured_ns[m & covered].sum() / total) if total else 0.0
    return out

"""The published comparison ("Table 9") of a decoded GPT-NeoX run: our errors next to the published ones (pure).

Inputs are per-module times in µs as ``[head, middle, tail]`` lists (the three traced pipeline stages;
0 or None = not found on that stage):

* ``measured`` — ``best_batch/module_times_average.csv`` (the values every published error used),
  keyed by the measured module names (``update`` = ``train_batch``, ``optimizer`` = the optimizer step);
* ``measured_old`` / ``measured_min`` — ``module_times_average_old.csv`` and ``module_times_min.csv``,
  used only to find cells edited by hand (a value that differs from the old file, or an average where
  the min file found nothing);
* ``predicted`` — our prediction with the measured names: ``optimizer`` is our optimizer-step span (the
  published calls its prediction of it ``update``), ``update`` our iteration;
* ``published`` — the run's ``compares.csv`` as read by ``tracecal.sources.gpumodeling25.read.tables``.

Selection rules are the published ones (``COMPONENTS``): a scalar component reduces a per-stage list
to its second-largest non-zero value (the median of three; the smaller one when one stage is 0); a
``*_max`` component takes the stage with the largest prediction — ours for our error, the published
prediction for the published error. Errors are (predicted − measured) / measured in %.

In ``to_csv`` and ``to_markdown`` a component ending in * was edited by hand in the published
measurements and is left out of every summary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import polars as pl

Times = Mapping[str, Sequence[float | None]]
"""Per-module ``[head, middle, tail]`` times in µs."""

STAGES = ("head", "middle", "tail")
"""Positions of the per-stage lists: the first, a middle and the last pipeline stage."""


@dataclass(frozen=True)
class Component:
    """One published Table 9 row: which modules it pairs and how it picks one value of the lists.

    ``pick``: ``"scalar"`` (second-largest non-zero of each list), ``"head"`` (the first stage), or
    ``"max"`` (the stage whose prediction of ``pick_by`` is the largest).
    """

    name: str
    measured: str
    predicted: str
    published: str
    pick: str
    pick_by: str = ""
    published_pick_by: str = ""


COMPONENTS = (
    Component("encoder_fwd", "encoder_fwd", "encoder_fwd", "encoder_fwd", "scalar"),
    Component("encoder_bwd", "encoder_bwd", "encoder_bwd", "encoder_bwd", "scalar"),
    Component("stage_fwd_max", "stage_fwd", "stage_fwd", "stage_fwd", "max", "stage_fwd", "stage_fwd"),
    Component("stage_bwd_max", "stage_bwd", "stage_bwd", "stage_bwd", "max", "stage_bwd", "stage_bwd"),
    Component("dp_allreduce(1st stage)", "dp_allreduce", "dp_allreduce", "dp_allreduce", "head"),
    Component("dp_allgather(max_update)", "dp_allgather", "dp_allgather", "dp_allgather", "max", "optimizer", "update"),
    Component("max_update", "optimizer", "optimizer", "update", "max", "optimizer", "update"),
    Component("mp_allreduce", "mp_allreduce", "mp_allreduce", "mp_allreduce", "scalar"),
    Component("pp_p2p", "pp_p2p", "pp_p2p", "pp_p2p", "scalar"),
    Component("Overall", "update", "update", "1F1B_max_optimizer", "scalar"),
)
"""The published Table 9 rows in order (``published``: the row name in ``compares.csv``)."""

COMPONENT_NAMES = tuple(c.name for c in COMPONENTS)

PUBLISHED_TO_OURS = {"update": "optimizer", "1F1B_max_optimizer": "update"}
"""``compares.csv`` prediction names that differ from ours (the rest are the same)."""

EDITED_NOTE = (
    "A component ending in * was edited by hand in the published measurements and is left out of every summary."
)
"""What the * suffix of a component means, in every rendering."""

CSV_COLUMNS = ("run_id", "component", "measured_ms", "predicted_ms", "error_pct", "published_error_pct")
"""The columns ``to_csv`` writes, in order."""

_SCHEMA = {
    "run_id": pl.String,
    "component": pl.String,
    "measured_ms": pl.Float64,
    "predicted_ms": pl.Float64,
    "error_pct": pl.Float64,
    "published_error_pct": pl.Float64,
    "hand_edited": pl.Boolean,
}


def _found(value: float | None) -> TypeGuard[float]:
    return value is not None and value == value and value != 0


def _as_list(value: float | Sequence[float | None] | None) -> list[float | None]:
    """A per-stage list; a scalar (the published scalar predictions) stands for every stage."""
    if value is None:
        return [None, None, None]
    if isinstance(value, int | float):
        return [float(value)] * 3
    return [float(v) if _found(v) else None for v in value]


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1e3


def second_largest(values: Sequence[float | None]) -> float | None:
    """The published reduction of a per-stage list to one value: zeros (not found) are dropped and the
    second-largest of the rest is kept (the only one when one is left, None when none is)."""
    kept = sorted((v for v in values if _found(v)), reverse=True)
    if not kept:
        return None
    return kept[1] if len(kept) > 1 else kept[0]


def _argmax(values: Sequence[float | None]) -> int | None:
    """Index of the largest found value, the first one on a tie (as the published ``list.index(max)``)."""
    found = [(v, i) for i, v in enumerate(values) if _found(v)]
    if not found:
        return None
    best = max(v for v, _ in found)
    return next(i for v, i in found if v == best)


def edited_stages(module: str, measured: Times, measured_old: Times | None, measured_min: Times | None) -> list[bool]:
    """Per stage: was ``measured[module]`` edited by hand (docs/published-runs.md#prediction-and-validation)?

    A value differs from the pre-edit file, or contradicts the min file: the min file found nothing on
    that stage while the average holds a value, or the average lies below the minimum (neither can come
    out of averaging occurrences; a microsecond of slack covers the min file's integer rounding)."""
    now = _as_list(measured.get(module))
    old = _as_list(measured_old.get(module)) if measured_old and module in measured_old else now
    low = _as_list(measured_min.get(module)) if measured_min and module in measured_min else now
    return [(n != o) or (_found(n) and (not _found(m) or n < m - 1.0)) for n, o, m in zip(now, old, low, strict=True)]


def _stage(component: Component, by: Sequence[float | None]) -> int | None:
    """The stage a per-stage component is read at (None for a scalar component or no prediction)."""
    if component.pick == "head":
        return 0
    return _argmax(by) if component.pick == "max" else None


def _published_cell(component: Component, published: Mapping[str, Mapping] | None) -> tuple[float | None, int | None]:
    """The published error of a component in % and the stage it was read at, chosen by the published
    predictions (``compares.csv`` already holds the scalar components reduced)."""
    row = (published or {}).get(component.published)
    if row is None:
        return None, None
    error = row["error"]
    if isinstance(error, int | float):
        return 100.0 * float(error), None
    by = (published or {}).get(component.published_pick_by or component.published, {}).get("prediction")
    stage = _stage(component, _as_list(by))
    return (None, None) if stage is None else (100.0 * float(error[stage]), stage)


def component_errors(
    run_id: str,
    measured: Times,
    measured_old: Times | None,
    measured_min: Times | None,
    predicted: Times,
    published: Mapping[str, Mapping] | None,
) -> pl.DataFrame:
    """One row per published Table 9 component (``COMPONENT_NAMES`` order) of one run.

    Columns: ``run_id``; ``component``; ``measured_ms`` and ``predicted_ms`` (the selected values, ms;
    null when the module was not found); ``error_pct`` = 100·(predicted − measured)/measured;
    ``published_error_pct`` (null without ``published`` or its row); ``hand_edited``: a measured value
    this cell depends on was edited by hand — at our selected stage, at the published selected stage,
    or on any stage for a scalar component (the edit may change which stage is the second largest), so
    that ours and the published are summarised over the same cells.
    """
    rows = []
    for comp in COMPONENTS:
        meas_list = _as_list(measured.get(comp.measured))
        pred_list = _as_list(predicted.get(comp.predicted))
        edited = edited_stages(comp.measured, measured, measured_old, measured_min)
        published_pct, theirs = _published_cell(comp, published)
        if comp.pick == "scalar":
            meas, pred, hand = second_largest(meas_list), second_largest(pred_list), any(edited)
        else:
            stage = _stage(comp, _as_list(predicted.get(comp.pick_by)) if comp.pick_by else pred_list)
            meas = None if stage is None else meas_list[stage]
            pred = None if stage is None else pred_list[stage]
            hand = any(edited[s] for s in (stage, theirs) if s is not None)
        rows.append(
            {
                "run_id": run_id,
                "component": comp.name,
                "measured_ms": _ms(meas),
                "predicted_ms": _ms(pred),
                "error_pct": None if meas is None or pred is None else 100.0 * (pred - meas) / meas,
                "published_error_pct": published_pct,
                "hand_edited": hand,
            }
        )
    return pl.DataFrame(rows, schema=_SCHEMA, orient="row")


def predicted_from_published(published: Mapping[str, Mapping]) -> dict[str, list[float]]:
    """The published predictions of ``compares.csv`` under our names (``update`` -> ``optimizer``,
    ``1F1B_max_optimizer`` -> ``update``), scalars repeated per stage: what ``component_errors``
    takes as ``predicted`` to recompute the published errors."""
    out = {}
    for module, row in published.items():
        values = _as_list(row["prediction"])
        out[PUBLISHED_TO_OURS.get(module, module)] = [0.0 if v is None else v for v in values]
    return out


def stage_comparison(
    run_id: str, measured: Times, measured_old: Times | None, measured_min: Times | None, predicted: Times
) -> pl.DataFrame:
    """Measured vs predicted per stage of the per-stage modules (``stage_fwd``, ``stage_bwd``,
    ``optimizer``): columns run_id, module, stage (``STAGES``), measured_ms, predicted_ms, hand_edited."""
    rows = []
    for module in ("stage_fwd", "stage_bwd", "optimizer"):
        meas = _as_list(measured.get(module))
        pred = _as_list(predicted.get(module))
        edited = edited_stages(module, measured, measured_old, measured_min)
        for i, stage in enumerate(STAGES):
            rows.append(
                {
                    "run_id": run_id,
                    "module": module,
                    "stage": stage,
                    "measured_ms": _ms(meas[i]),
                    "predicted_ms": _ms(pred[i]),
                    "hand_edited": edited[i],
                }
            )
    schema: dict[str, type[pl.DataType]] = {"run_id": pl.String, "module": pl.String, "stage": pl.String}
    schema |= {"measured_ms": pl.Float64, "predicted_ms": pl.Float64, "hand_edited": pl.Boolean}
    return pl.DataFrame(rows, schema=schema, orient="row")


def component_shares(
    run_id: str,
    predicted: Times,
    *,
    micro_batches: int,
    pipeline_stages: int,
    layers: Sequence[int],
    tp_allreduces: tuple[int, int],
) -> pl.DataFrame:
    """Share of our predicted iteration each component takes over one iteration, as the published
    Figure 4 counts it (shares overlap and need not add up to 100 %).

    ``layers``: encoder layers of the ``[head, middle, tail]`` stages; ``tp_allreduces``: the
    tensor-parallel all-reduces of one layer forward and backward (n_f, n_b). With s = m + p − 1
    pipeline slots and L_f, L_b the layers of the stage with the largest predicted forward, backward:
    encoder_fwd·(L_f + L_b)·s (the backward recomputes the forward), encoder_bwd·L_b·s, max stage
    forward·s and backward·s, the head all-reduce, all-gather and optimizer step at the stage with the
    largest optimizer step, mp_allreduce·(n_f·L_f + (n_f + n_b)·L_b)·s, and pp_p2p·2·s (an activation
    and a gradient send per slot; the published figure read mp_allreduce there by mistake).
    Columns: run_id, component (``COMPONENT_NAMES`` without Overall), predicted_ms, share_pct.
    """
    slots = micro_batches + pipeline_stages - 1
    n_f, n_b = tp_allreduces

    def at(module: str, stage: int | None) -> float | None:
        return None if stage is None else _as_list(predicted.get(module))[stage]

    fwd_stage, bwd_stage = _argmax(_as_list(predicted.get("stage_fwd"))), _argmax(_as_list(predicted.get("stage_bwd")))
    l_f = layers[fwd_stage] if fwd_stage is not None else 0
    l_b = layers[bwd_stage] if bwd_stage is not None else 0
    opt_stage = _argmax(_as_list(predicted.get("optimizer")))

    def times(value: float | None, count: float) -> float | None:
        return None if value is None else value * count

    one = {name: second_largest(_as_list(predicted.get(name))) for name in ("encoder_fwd", "encoder_bwd")}
    one |= {name: second_largest(_as_list(predicted.get(name))) for name in ("mp_allreduce", "pp_p2p")}
    parts = {
        "encoder_fwd": times(one["encoder_fwd"], (l_f + l_b) * slots),
        "encoder_bwd": times(one["encoder_bwd"], l_b * slots),
        "stage_fwd_max": times(at("stage_fwd", fwd_stage), slots),
        "stage_bwd_max": times(at("stage_bwd", bwd_stage), slots),
        "dp_allreduce(1st stage)": at("dp_allreduce", 0),
        "dp_allgather(max_update)": at("dp_allgather", opt_stage),
        "max_update": at("optimizer", opt_stage),
        "mp_allreduce": times(one["mp_allreduce"], (n_f * l_f + (n_f + n_b) * l_b) * slots),
        "pp_p2p": times(one["pp_p2p"], 2 * slots),
    }
    iteration = second_largest(_as_list(predicted.get("update")))
    rows = [
        {
            "run_id": run_id,
            "component": name,
            "predicted_ms": _ms(value),
            "share_pct": None if value is None or iteration is None else 100.0 * value / iteration,
        }
        for name, value in parts.items()
    ]
    schema = {"run_id": pl.String, "component": pl.String, "predicted_ms": pl.Float64, "share_pct": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def _concat(frames: pl.DataFrame | Iterable[pl.DataFrame]) -> pl.DataFrame:
    if isinstance(frames, pl.DataFrame):
        return frames
    frames = list(frames)
    return pl.concat(frames) if frames else pl.DataFrame(schema=_SCHEMA)


def summary(frames: pl.DataFrame | Iterable[pl.DataFrame]) -> pl.DataFrame:
    """Per component over runs, hand-edited cells left out: ``cells`` (runs with our error),
    ``mean_abs_error_pct`` (ours), ``published_mean_abs_error_pct`` (the published, over the cells that
    have it), ``ours_lower_share`` (share of cells with both errors where |ours| < |published| at 2
    decimals),
    ``above_10pct`` and ``published_above_10pct`` (cells with |error| > 10 %)."""
    frame = _concat(frames).filter(~pl.col("hand_edited"))
    ours, theirs = pl.col("error_pct").abs(), pl.col("published_error_pct").abs()
    # "lower" at the published precision (2 decimals), so a tie in print is not counted as a win
    ours_lower = ours.round(2) < theirs.round(2)
    both = pl.col("error_pct").is_not_null() & pl.col("published_error_pct").is_not_null()
    stats = frame.group_by("component").agg(
        pl.col("error_pct").is_not_null().sum().cast(pl.Int64).alias("cells"),
        ours.mean().alias("mean_abs_error_pct"),
        theirs.mean().alias("published_mean_abs_error_pct"),
        (ours_lower & both).sum().truediv(both.sum()).alias("ours_lower_share"),
        (ours > 10).sum().cast(pl.Int64).alias("above_10pct"),
        (theirs > 10).sum().cast(pl.Int64).alias("published_above_10pct"),
    )
    order = pl.DataFrame({"component": list(COMPONENT_NAMES)})
    out = order.join(stats, on="component", how="left")
    return out.with_columns(
        pl.col("cells", "above_10pct", "published_above_10pct").fill_null(0),
        # a 0/0 share (no cell has both errors) is unknown, not NaN
        pl.col("ours_lower_share").fill_nan(None),
    )


def _labelled(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(
        pl.when(pl.col("hand_edited")).then(pl.col("component") + "*").otherwise(pl.col("component")).alias("component")
    )


def to_csv(frames: pl.DataFrame | Iterable[pl.DataFrame]) -> str:
    """The error rows as CSV with exactly ``CSV_COLUMNS``; a component ending in * was edited by hand in
    the published measurements and is left out of every summary. Times in ms to 3 decimals (µs),
    errors in % to 2 decimals (the published precision)."""
    frame = _labelled(_concat(frames)).select(
        "run_id",
        "component",
        pl.col("measured_ms", "predicted_ms").round(3),
        pl.col("error_pct", "published_error_pct").round(2),
    )
    return frame.write_csv()


def _fmt(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def to_markdown(frames: pl.DataFrame | Iterable[pl.DataFrame], summary_frame: pl.DataFrame) -> str:
    """Markdown: per run, ours and the published error side by side per component, then the mean
    |error| per component over runs (``summary_frame`` from ``summary``)."""
    frame = _labelled(_concat(frames))
    lines: list[str] = []
    for run_id in dict.fromkeys(frame["run_id"].to_list()):
        lines += [f"### {run_id}", ""]
        rows = frame.filter(pl.col("run_id") == run_id).iter_rows(named=True)
        lines += _table(
            ("component", "measured ms", "predicted ms", "error %", "published error %"),
            (
                (
                    r["component"],
                    _fmt(r["measured_ms"], 3),
                    _fmt(r["predicted_ms"], 3),
                    _fmt(r["error_pct"], 2),
                    _fmt(r["published_error_pct"], 2),
                )
                for r in rows
            ),
        )
        lines.append("")
    lines += ["### mean |error| per component (hand-edited cells left out)", ""]
    lines += _table(
        ("component", "cells", "ours %", "published %", "ours lower", "ours > 10 %", "published > 10 %"),
        (
            (
                r["component"],
                str(r["cells"]),
                _fmt(r["mean_abs_error_pct"], 2),
                _fmt(r["published_mean_abs_error_pct"], 2),
                _fmt(None if r["ours_lower_share"] is None else 100 * r["ours_lower_share"], 0)
                + ("%" if r["ours_lower_share"] is not None else ""),
                str(r["above_10pct"]),
                str(r["published_above_10pct"]),
            )
            for r in summary_frame.iter_rows(named=True)
        ),
    )
    lines += [
        "",
        "A component ending in * was edited by hand in the published measurements and is left out of every summary.",
    ]
    return "\n".join(lines) + "\n"

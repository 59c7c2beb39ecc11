"""A decoded run's published Table 9 cells, each error split by the schedule and the op families (pure).

The split is ``tracecal.predict.attribution``'s (``component_attribution``): every family replay is
read off at the stage the published rules score the whole prediction at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import polars as pl

from tracecal.predict.attribution import FamilyReplays, family_replays, split_error
from tracecal.predict.run import Prediction
from tracecal.sources.gpumodeling25.validate import published
from tracecal.sources.gpumodeling25.validate.module_times import module_times, per_position


def _position(component: published.Component, predicted: Mapping[str, Sequence[float]]) -> int | None:
    """The stage a Table 9 cell reads our prediction at (the published selection rules applied to the
    whole prediction), so that every replay is read at the same stage."""
    values = list(predicted.get(component.predicted, []))
    if component.pick == "head":
        return 0 if values else None
    if component.pick == "max":
        by = list(predicted.get(component.pick_by or component.predicted, []))
        found = [(v, i) for i, v in enumerate(by) if v]
        return max(found, key=lambda vi: (vi[0], -vi[1]))[1] if found else None
    chosen = published.second_largest(values)
    return None if chosen is None else values.index(chosen)


def published_attribution(
    prediction: Prediction,
    members: pl.DataFrame,
    traced_ranks: list[int],
    cells: pl.DataFrame,
    replays: FamilyReplays | None = None,
) -> pl.DataFrame:
    """The published Table 9 cells of one decoded run (``cells``: ``published.component_errors`` rows of
    ``prediction``), each error split like ``component_attribution``: run_id, component, measured_ns,
    predicted_ns, error_pct, schedule_pct, ``family_<f>_pct``, interaction_pct, hand_edited.

    ``members``: the run's module members (``module_times.module_members``); ``traced_ranks``: head, middle
    and tail (``published_runs.traced_ranks``). Every replay is read at the stage the whole prediction
    is scored at."""
    replays = replays or family_replays(prediction)
    full = per_position(module_times(members, prediction), traced_ranks, "predicted_us")
    per_part = {
        part: per_position(
            module_times(members, replace(prediction, replayed=replays.replayed(part))), traced_ranks, "predicted_us"
        )
        for part in ["measured", *replays.families]
    }
    rows = []
    for comp, cell in zip(published.COMPONENTS, cells.iter_rows(named=True), strict=True):
        stage = _position(comp, full)
        row = {
            "run_id": cell["run_id"],
            "component": comp.name,
            "hand_edited": cell["hand_edited"],
            "measured_ns": None if cell["measured_ms"] is None else cell["measured_ms"] * 1e6,
            "predicted_ns": None if cell["predicted_ms"] is None else cell["predicted_ms"] * 1e6,
        }
        for part, times in per_part.items():
            values = times.get(comp.predicted)
            value = None if stage is None or not values else values[stage] * 1e3
            row[f"replay_{part}_ns"] = value
        rows.append(row)
    frame = pl.DataFrame(rows, infer_schema_length=None)
    keys = ["run_id", "component", "hand_edited"]
    return split_error(frame, keys, replays.families)

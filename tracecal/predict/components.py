"""Per-rank component times of an iteration (see docs/decode.md), measured vs replayed, and their errors.

Each rank's iteration span is split into disjoint time: every instant counts once, for the highest
priority component active at that instant (``COMPONENTS`` order: compute first, then communication by
role, then memory copies), and ``idle`` when nothing runs. Communication time is therefore *exposed*
communication — the part not hidden behind compute — and the components of a rank add up to its
iteration time. The ``iteration`` component is the span itself.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracecal.predict.durations import Durations
from tracecal.predict.graph import ReplayGraph

COMPONENTS = (
    "compute_fwd",
    "compute_bwd",
    "optimizer",
    "other",
    "comm_tp",
    "comm_dp",
    "comm_pp",
    "comm_ep",
    "comm_other",
    "memcpy",
)
"""Busy components in priority order (an instant covered by several counts for the first)."""

ALL_COMPONENTS = (*COMPONENTS, "idle", "iteration")
"""Every component a table reports, in display order."""

_ROLE_COMPONENT = {"tp": "comm_tp", "dp": "comm_dp", "pp": "comm_pp", "ep": "comm_ep"}


def node_components(graph: ReplayGraph) -> np.ndarray:
    """Component of every node (None for runtime calls, collective instances and markers).

    A matched collective member takes its group role (``comm_tp`` ...); other operators keep their
    decoded component; anything unknown is ``other``."""
    nodes = graph.nodes
    role = pl.col("role") if "role" in nodes.columns else pl.lit(None, pl.String)
    comp = pl.col("component") if "component" in nodes.columns else pl.lit(None, pl.String)
    out = nodes.select(
        pl.when(pl.col("node_kind") != "activity")
        .then(None)
        .when(pl.col("match_id").is_not_null())
        .then(role.replace_strict(_ROLE_COMPONENT, default="comm_other"))
        .when(comp.is_in(COMPONENTS))
        .then(comp)
        .otherwise(pl.lit("other"))
    ).to_series()
    return out.to_numpy().astype(object)


def rank_spans(graph: ReplayGraph, times: np.ndarray) -> pl.DataFrame:
    """Per rank: start_ns, end_ns of the iteration span (over the nodes that bound it)."""
    nodes = graph.nodes
    span = nodes["in_span"].to_numpy()
    frame = pl.DataFrame(
        {
            "rank": nodes["rank"].to_numpy()[span],
            "start_ns": times[0::2][span],
            "end_ns": times[1::2][span],
        }
    )
    return frame.group_by("rank").agg(pl.col("start_ns").min(), pl.col("end_ns").max()).sort("rank")


def breakdown(span: tuple[int, int], starts: np.ndarray, ends: np.ndarray, cats: np.ndarray) -> np.ndarray:
    """Disjoint time per busy component (index into ``COMPONENTS``) within ``span``, plus idle last.

    Args:
        span: (start, end) of the rank's iteration.
        starts, ends: intervals (ns); cats: their component index.

    Returns:
        float array of ``len(COMPONENTS) + 1`` ns; it sums to ``end - start``.
    """
    lo, hi = span
    s = np.clip(starts, lo, hi)
    e = np.clip(ends, lo, hi)
    keep = e > s
    s, e, c = s[keep], e[keep], cats[keep]
    bounds = np.unique(np.concatenate([s, e, [lo, hi]]))
    lengths = np.diff(bounds).astype(float)
    k = len(COMPONENTS)
    cover = np.zeros((k, bounds.size), dtype=np.int64)
    np.add.at(cover, (c, np.searchsorted(bounds, s)), 1)
    np.add.at(cover, (c, np.searchsorted(bounds, e)), -1)
    active = np.cumsum(cover, axis=1)[:, :-1] > 0
    busy = active.any(axis=0)
    first = np.argmax(active, axis=0)
    out = np.zeros(k + 1)
    out[:k] = np.bincount(first[busy], weights=lengths[busy], minlength=k)
    out[k] = lengths[~busy].sum()
    return out


def _covered(graph: ReplayGraph, durations: Durations) -> np.ndarray:
    """Per node: its duration came from a model (members: their collective instance's did)."""
    nodes = graph.nodes
    covered = durations.source == "model"
    inst = nodes.filter(pl.col("node_kind") == "collective").select("match_id", pl.col("node").alias("_inst"))
    members = nodes.filter((pl.col("node_kind") == "activity") & pl.col("match_id").is_not_null())
    members = members.select("node", "match_id").join(inst, on="match_id", how="inner")
    out = covered.copy()
    out[members["node"].to_numpy()] = covered[members["_inst"].to_numpy()]
    return out


def component_table(graph: ReplayGraph, replayed: np.ndarray, durations: Durations) -> pl.DataFrame:
    """Per rank and component: measured_ns, predicted_ns, error_pct, covered_share.

    ``covered_share`` is the share of the component's measured operator time whose duration came
    from a model (NULL for idle; for ``iteration`` over all operators)."""
    measured = graph.measured_times
    comp = node_components(graph)
    act = np.flatnonzero(comp != None)  # noqa: E711 (numpy elementwise comparison)
    cat = np.array([COMPONENTS.index(c) for c in comp[act]], dtype=np.int64)
    ranks = graph.nodes["rank"].to_numpy()[act]
    dur = graph.nodes["dur_ns"].to_numpy()[act].astype(float)
    cov = _covered(graph, durations)[act]
    m_spans = rank_spans(graph, measured)
    p_spans = rank_spans(graph, replayed).rename({"start_ns": "p_start", "end_ns": "p_end"})
    spans = m_spans.join(p_spans, on="rank", how="inner")
    rows = []
    for r, ms, me, ps, pe in spans.iter_rows():
        sel = ranks == r
        idx = act[sel]
        m = breakdown((ms, me), measured[2 * idx], measured[2 * idx + 1], cat[sel])
        p = breakdown((ps, pe), replayed[2 * idx], replayed[2 * idx + 1], cat[sel])
        busy = np.bincount(cat[sel], weights=dur[sel], minlength=len(COMPONENTS))
        busy_cov = np.bincount(cat[sel], weights=dur[sel] * cov[sel], minlength=len(COMPONENTS))
        for j, name in enumerate(COMPONENTS):
            share = busy_cov[j] / busy[j] if busy[j] > 0 else None
            rows.append((r, name, round(m[j]), round(p[j]), share))
        rows.append((r, "idle", round(m[-1]), round(p[-1]), None))
        total = dur[sel].sum()
        share_all = (dur[sel] * cov[sel]).sum() / total if total else None
        rows.append((r, "iteration", int(me - ms), int(pe - ps), share_all))
    out = pl.DataFrame(
        rows,
        schema={
            "rank": pl.Int32,
            "component": pl.String,
            "measured_ns": pl.Int64,
            "predicted_ns": pl.Int64,
            "covered_share": pl.Float64,
        },
        orient="row",
    )
    return out.with_columns(error_pct_expr()).select(
        "rank", "component", "measured_ns", "predicted_ns", "error_pct", "covered_share"
    )


def error_pct_expr(measured: str = "measured_ns", predicted: str = "predicted_ns") -> pl.Expr:
    """(predicted − measured) / measured × 100, NULL when measured is 0."""
    return (
        pl.when(pl.col(measured) > 0)
        .then((pl.col(predicted) - pl.col(measured)) / pl.col(measured) * 100.0)
        .otherwise(None)
        .alias("error_pct")
    )


def prediction_rows(graph: ReplayGraph, replayed: np.ndarray, durations: Durations) -> pl.DataFrame:
    """One row per operator: rank, event_id, family, component, measured_dur_ns, predicted_dur_ns
    (its replayed length), duration_source, replay_start_ns/replay_end_ns relative to its rank's
    replayed iteration start."""
    comp = node_components(graph)
    act = np.flatnonzero(comp != None)  # noqa: E711
    nodes = graph.nodes[act]
    p_spans = rank_spans(graph, replayed).select("rank", pl.col("start_ns").alias("_origin"))
    source = durations.source.copy()
    member = nodes["match_id"].is_not_null().to_numpy()
    source[act[member]] = np.where(_covered(graph, durations)[act[member]], "model", "measured")
    frame = pl.DataFrame(
        {
            "rank": nodes["rank"].to_numpy(),
            "event_id": nodes["event_id"].to_numpy(),
            "family": nodes["family"].to_numpy(),
            "component": comp[act].astype(str),
            "measured_dur_ns": nodes["dur_ns"].to_numpy(),
            "start": replayed[2 * act],
            "end": replayed[2 * act + 1],
            "duration_source": source[act].astype(str),
        }
    ).join(p_spans, on="rank", how="left")
    return frame.select(
        pl.col("rank").cast(pl.Int32),
        "event_id",
        "family",
        "component",
        "measured_dur_ns",
        (pl.col("end") - pl.col("start")).alias("predicted_dur_ns"),
        "duration_source",
        (pl.col("start") - pl.col("_origin")).alias("replay_start_ns"),
        (pl.col("end") - pl.col("_origin")).alias("replay_end_ns"),
    )


def run_summary(components: pl.DataFrame) -> pl.DataFrame:
    """Across ranks, per component: the time summed over ranks (the iteration: the slowest rank),
    measured vs predicted, error %. Input: ``component_table`` rows (optionally with a run_id)."""
    keys = ["run_id", "component"] if "run_id" in components.columns else ["component"]
    busy = (
        components.filter(pl.col("component") != "iteration")
        .group_by(keys)
        .agg(pl.col("measured_ns").sum(), pl.col("predicted_ns").sum())
    )
    it = (
        components.filter(pl.col("component") == "iteration")
        .group_by(keys)
        .agg(pl.col("measured_ns").max(), pl.col("predicted_ns").max())
    )
    order = {c: i for i, c in enumerate(ALL_COMPONENTS)}
    out = pl.concat([busy, it]).with_columns(error_pct_expr())
    return out.sort([*keys[:-1], pl.col("component").replace_strict(order, default=99)])

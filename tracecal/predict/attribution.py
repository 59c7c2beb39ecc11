"""Where a prediction's error comes from: the schedule's share and each op family's share (pure).

For every component (per rank, or a published Table 9 cell: ``gpumodeling25.validate.attribution``)
with measured time ``M``, predicted time ``P`` (every duration from its model) and the same graph
replayed three more ways:

* ``R_measured``: every duration measured (the measured-mode replay);
* ``R_f``: the durations of family ``f`` predicted, every other one measured, one replay per family;

the error ``P − M`` splits into

* **schedule** ``R_measured − M``: what the graph and its lags miss with the right durations (on a
  traced run 0 for the fitted replay; on a rebuilt decoded run its fidelity error);
* **family f** ``R_f − R_measured``: what predicting that family alone changes;
* **interaction** ``(P − M) − schedule − Σ_f family f``: what the families change together beyond the
  sum of their separate effects (a collective that waits for the later of two predicted streams).

The parts add up to the error exactly; each is reported in % of ``M`` like the error itself.

Families are the operators' own (``gemm``, ``norm``, ``optimizer``, ...), with communication split by
the collective's role (``comm_tp``, ``comm_dp``, ``comm_pp``; ``comm`` when the role is unknown), so
the attribution names the model to fix. Only families whose durations the prediction changed get a
replay; the rest kept their measured durations and have no share.

Every family replay changes nothing but durations, so all of them run in one pass over the graph's
topological rounds (``replay_many``): a (points × replays) time matrix instead of one replay each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from tracecal.errors import PredictionError
from tracecal.predict import durations as dmod
from tracecal.predict.components import component_table, run_summary
from tracecal.predict.edges import NO_TIME
from tracecal.predict.graph import ReplayGraph
from tracecal.predict.replay import edge_lags
from tracecal.predict.run import Prediction

SCHEDULE = "schedule"
INTERACTION = "interaction"
"""Names of the two parts that are not a family."""

FAMILY_PREFIX = "family_"
"""Wide tables name a family's column ``family_<name>_pct``."""


def family_groups(graph: ReplayGraph) -> np.ndarray:
    """Per node, the family its predicted duration is attributed to (None for nodes whose duration
    is never predicted): the operator family, and for communication ``comm_<role>``."""
    nodes = graph.nodes
    own = (nodes["duration_role"] == "own") & nodes["node_kind"].is_in(["activity", "collective"])
    role = pl.col("role") if "role" in nodes.columns else pl.lit(None, pl.String)
    family = pl.col("family").fill_null("other")
    label = (
        pl.when(~own)
        .then(None)
        .when(family == "comm")
        .then(pl.when(role.is_not_null()).then(pl.lit("comm_") + role).otherwise(pl.lit("comm")))
        .otherwise(family)
    )
    return nodes.select(label.alias("group")).to_series().to_numpy().astype(object)


def changed_families(graph: ReplayGraph, durations: dmod.Durations) -> list[str]:
    """Families with at least one duration that differs from the measured one, sorted."""
    groups = family_groups(graph)
    changed = durations.dur_ns != graph.nodes["dur_ns"].to_numpy()
    return sorted({g for g in groups[changed].tolist() if g is not None})


def replay_many(graph: ReplayGraph, durations_ns: np.ndarray, kind: str = "fitted") -> np.ndarray:
    """Replay the graph once per column of ``durations_ns`` (nodes × replays, int64 ns), in one pass:
    returns the (points × replays) times, column ``j`` equal to ``replay.replay(graph,
    durations_ns[:, j], kind)``.

    Raises:
        PredictionError: ``durations_ns`` does not have one row per node.
    """
    durations_ns = np.asarray(durations_ns, dtype=np.int64)
    if durations_ns.ndim != 2 or durations_ns.shape[0] != graph.nodes.height:
        raise PredictionError(f"replay_many needs one row per node ({graph.nodes.height}), got {durations_ns.shape}")
    k = durations_ns.shape[1]
    own = (graph.nodes["duration_role"] == "own").to_numpy()
    base = edge_lags(graph, None, kind) if kind == "dependency" else graph.lag
    lag = np.repeat(base[:, None], k, axis=1)
    lag[graph.duration_edge[own]] = durations_ns[own]
    sched = graph.schedule
    t = np.repeat(graph.release[:, None], k, axis=1)
    src, dst, lag = sched.src, sched.dst, lag[sched.edge_order]
    bounds = sched.level_bounds
    for i in range(bounds.size - 1):
        a, b = bounds[i], bounds[i + 1]
        np.maximum.at(t, dst[a:b], t[src[a:b]] + lag[a:b])
    if (t == NO_TIME).any():
        raise PredictionError("replay left points without a time: the graph was modified after building")
    return t


@dataclass(frozen=True)
class FamilyReplays:
    """The replays an attribution compares: ``measured`` (every duration measured) and one per
    family in ``families`` (that family's durations from the prediction, the rest measured), all of
    the prediction's replay kind. ``times[:, 0]`` is the measured replay, ``times[:, 1 + i]`` family
    ``families[i]``'s."""

    families: list[str]
    times: np.ndarray

    def replayed(self, part: str) -> np.ndarray:
        """Point times of the ``measured`` replay or of a family's."""
        return self.times[:, 0 if part == "measured" else 1 + self.families.index(part)]


def family_replays(prediction: Prediction) -> FamilyReplays:
    """Replay ``prediction``'s graph with measured durations and with each changed family predicted.

    Raises:
        PredictionError: the prediction changed no duration (nothing to attribute).
    """
    graph = prediction.graph
    families = changed_families(graph, prediction.durations)
    if not families:
        raise PredictionError(
            "--attribute: every duration of this prediction is measured; attribute a predicted (--cluster) "
            "or scaled (--scale) prediction"
        )
    return FamilyReplays(families, replay_many(graph, family_durations(prediction, families), prediction.replay))


def family_durations(prediction: Prediction, families: Sequence[str]) -> np.ndarray:
    """The (nodes × replays) durations of ``family_replays``: every duration measured, then one column
    per family with that family's durations taken from ``prediction``."""
    measured = prediction.graph.nodes["dur_ns"].to_numpy().astype(np.int64)
    groups = family_groups(prediction.graph)
    columns = [measured]
    for fam in families:
        dur = measured.copy()
        hit = groups == fam
        dur[hit] = prediction.durations.dur_ns[hit]
        columns.append(dur)
    return np.column_stack(columns)


def split_error(frame: pl.DataFrame, keys: list[str], families: Sequence[str]) -> pl.DataFrame:
    """``frame`` (keys, measured_ns, predicted_ns, ``replay_measured_ns`` and ``replay_<f>_ns``: each
    replay's time of the component) -> keys, measured_ns, predicted_ns and one ``<part>_ns`` per part
    (``schedule_ns``, ``family_<f>_ns``, ``interaction_ns``), which add up to predicted − measured."""
    m, base = pl.col("measured_ns"), pl.col("replay_measured_ns")
    parts = {SCHEDULE: base - m}
    for fam in families:
        parts[f"{FAMILY_PREFIX}{fam}"] = pl.col(f"replay_{fam}_ns") - base
    parts[INTERACTION] = (pl.col("predicted_ns") - m) - pl.sum_horizontal(list(parts.values()))
    return frame.select(
        *keys, "measured_ns", "predicted_ns", *[expr.cast(pl.Float64).alias(f"{n}_ns") for n, expr in parts.items()]
    )


def part_columns(frame: pl.DataFrame) -> list[str]:
    """The part columns of an attribution frame, in order (schedule, families, interaction), without
    their unit suffix."""
    return [
        c.removesuffix("_ns") for c in frame.columns if c.endswith("_ns") and c not in ("measured_ns", "predicted_ns")
    ]


def as_percent(frame: pl.DataFrame) -> pl.DataFrame:
    """An attribution frame in % of the measured time, as the error is: the ``<part>_ns`` columns
    become ``<part>_pct`` after ``error_pct`` (NULL where nothing was measured); they add up to it."""
    parts = part_columns(frame)
    m = pl.col("measured_ns")
    scale = pl.when(m > 0).then(100.0 / m).otherwise(None)
    keys = [c for c in frame.columns if not c.endswith("_ns")]
    return frame.select(
        *keys,
        "measured_ns",
        "predicted_ns",
        (scale * (pl.col("predicted_ns") - m)).alias("error_pct"),
        *[(scale * pl.col(f"{p}_ns")).alias(f"{p}_pct") for p in parts],
    )


def component_attribution(prediction: Prediction, replays: FamilyReplays | None = None) -> pl.DataFrame:
    """Per rank and component (the rows of ``prediction.components``, whose measured times are the
    ones scored): measured_ns, predicted_ns and the parts of the difference in ns (schedule_ns,
    ``family_<f>_ns`` per changed family, interaction_ns); ``as_percent`` turns them into % of the
    measured time. See the module docstring."""
    replays = replays or family_replays(prediction)
    keys = ["rank", "component"]
    frame = prediction.components.select(*keys, "measured_ns", "predicted_ns")
    for part in ["measured", *replays.families]:
        table = component_table(prediction.graph, replays.replayed(part), prediction.durations)
        frame = frame.join(
            table.select(*keys, pl.col("predicted_ns").alias(f"replay_{part}_ns")),
            on=keys,
            how="left",
            maintain_order="left",
        )
    return split_error(frame, keys, replays.families)


def run_attribution(per_rank: pl.DataFrame) -> pl.DataFrame:
    """``component_attribution`` rows (optionally with run_id) across ranks, as ``run_summary`` scores
    a run: busy components summed over ranks, the iteration of the slowest measured rank."""
    keys = ["run_id", "component"] if "run_id" in per_rank.columns else ["component"]
    cols = ["measured_ns", "predicted_ns", *[f"{p}_ns" for p in part_columns(per_rank)]]
    busy = per_rank.filter(pl.col("component") != "iteration").group_by(keys).agg(pl.col(cols).sum())
    slowest = (
        per_rank.filter(pl.col("component") == "iteration")
        .sort("measured_ns", descending=True)
        .group_by(keys, maintain_order=True)
        .first()
        .select(*keys, *cols)
    )
    order = run_summary(per_rank.select(*keys, "rank", "measured_ns", "predicted_ns")).select(keys)
    return order.join(pl.concat([busy, slowest]), on=keys, how="left", maintain_order="left")


def percent_columns(frame: pl.DataFrame) -> list[str]:
    """The part columns of a percent attribution table (``as_percent``), in order: schedule_pct,
    ``family_<f>_pct``, interaction_pct."""
    return [
        c
        for c in frame.columns
        if c in (f"{SCHEDULE}_pct", f"{INTERACTION}_pct") or (c.startswith(FAMILY_PREFIX) and c.endswith("_pct"))
    ]


def long_form(frame: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """A percent attribution table (``as_percent``) as rows: keys, error_pct, part (schedule, a
    family, interaction), share_pct."""
    parts = percent_columns(frame)
    out = frame.unpivot(index=[*keys, "error_pct"], on=parts, variable_name="part", value_name="share_pct")
    return out.with_columns(pl.col("part").str.strip_suffix("_pct").str.strip_prefix(FAMILY_PREFIX))

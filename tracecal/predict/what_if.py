"""What-if on another cluster: replay a run traced on one machine with another cluster's models, and
say what could not be modelled.

The operators keep their shapes; their durations come from the target cluster's models. The
communication topology follows the target: its GPUs per node from the user, else from the target's
communication samples (the largest node size they were taken on), and every collective's nodes and
GPUs per node are recomputed from its ranks (``decode.topology``).

An operator the target has no model for is not left at the source cluster's duration: it is scaled by
the ratio of the two clusters' peak rates (``cluster_ratios``), read off the samples both clusters
have: per op both sampled (matched by kind, e.g. ``gelu`` and ``aten::gelu``), the 90th percentile of
its samples' FLOP/s (GEMM, attention) or bytes/s (every other family) on each cluster; a family's
ratio is the geometric mean over its ops. A family only one cluster sampled takes the geometric mean
of the compute-bound families' ratios (GEMM, attention) or of the memory-bound ones (the rest).
Collectives use their own ratio only (a pooled rate means nothing across topologies). What no rule
covers keeps its measured duration, and ``measured_fallback`` names it with its share of the
iteration.

CPU-side gaps (the lags between operators, launch latencies, the host program) are kept as traced:
neither cluster's samples time the host. ``idle_share`` reports how much of the predicted iteration
the GPUs sat idle, the time those gaps can account for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from tracecal.predict.components import breakdown, rank_spans
from tracecal.predict.run import Prediction
from tracecal.sql.query_files import query_frame

COMPUTE_BOUND = ("gemm", "attention")
"""Families whose samples are compared by FLOP/s; every other compute family by bytes moved per s."""

MOSTLY_MEASURED = 0.10
"""Above this share of a rank's iteration kept as traced, a prediction is called mostly measured time."""


def target_gpus_per_node(
    con: duckdb.DuckDBPyConnection, run_id: str, cluster: str | None, gpus_per_node: int | None
) -> tuple[int | None, str]:
    """The GPUs per node a replay of ``run_id`` with ``cluster``'s models places ranks on (None: as
    traced) and where that number came from."""
    if gpus_per_node is not None:
        return gpus_per_node, "--gpus-per-node"
    row = con.execute("SELECT cluster FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if cluster is None or row is None or row[0] == cluster:
        return None, "the run's own layout"
    found = con.execute(
        "SELECT max(gpus_per_node) FROM samples WHERE cluster = ? AND family = 'comm'", [cluster]
    ).fetchone()
    if found is None or found[0] is None:
        return None, f"the run's own layout ({cluster}'s communication samples state no GPUs per node)"
    return int(found[0]), f"the largest node size of {cluster}'s communication samples"


def run_cluster(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """The cluster a run was traced on (``runs.cluster``; None when unknown)."""
    row = con.execute("SELECT cluster FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return None if row is None else row[0]


def is_what_if(mode: str, source: str | None, target: str | None, gpus_per_node: int | None) -> bool:
    """A replay that changes the machine or the durations on purpose (scaled durations, another
    cluster's models, another node size): its difference to the traced run is a change, not an error."""
    return (
        mode == "scaled"
        or gpus_per_node is not None
        or (mode == "predicted" and source is not None and target is not None and source != target)
    )


@dataclass(frozen=True)
class ClusterRatio:
    """Target duration = source duration × ``factor`` for a family no target model covers;
    ``basis`` says which samples the factor comes from."""

    family: str
    factor: float
    basis: str


def sample_rates(con: duckdb.DuckDBPyConnection, source: str, target: str) -> pl.DataFrame:
    """``cluster_sample_rates.sql``: cluster, family, op, work, rate of every plausible sample of the
    two clusters."""
    return query_frame(con, "cluster_sample_rates", [source, target, list(COMPUTE_BOUND)])


PEAK_QUANTILE = 0.9
"""The rate a cluster's samples of one op reach: this quantile of their rates (its achieved peak)."""


def _peak_ratios(rates: pl.DataFrame, source: str, target: str) -> dict[str, tuple[float, list[str]]]:
    """Per family both clusters sampled: source peak / target peak and the ops it compares. The ops
    are matched by kind (``routing.op_kind``: ``gelu`` and ``aten::gelu``, ``res_add`` and
    ``aten::add``), the family's ratio being the geometric mean over the kinds both sampled; a family
    with no kind in common compares its samples as a whole."""
    from tracecal.calibrate.routing import op_kind

    kinds = {op: op_kind(op) or "" for op in rates["op"].unique().to_list()}
    peaks = (
        rates.with_columns(pl.col("op").replace_strict(kinds, return_dtype=pl.String).alias("kind"))
        .group_by("cluster", "family", "kind")
        .agg(pl.col("rate").quantile(PEAK_QUANTILE).alias("peak"))
    )
    whole = rates.group_by("cluster", "family").agg(pl.col("rate").quantile(PEAK_QUANTILE).alias("peak"))
    out: dict[str, tuple[float, list[str]]] = {}
    for family in sorted(set(rates["family"].to_list())):
        fam = peaks.filter((pl.col("family") == family) & (pl.col("kind") != ""))
        src = dict(fam.filter(pl.col("cluster") == source).select("kind", "peak").iter_rows())
        tgt = dict(fam.filter(pl.col("cluster") == target).select("kind", "peak").iter_rows())
        common = sorted(k for k in src if k in tgt and src[k] > 0 and tgt[k] > 0)
        if common:
            logs = [math.log(src[k] / tgt[k]) for k in common]
            out[family] = (math.exp(sum(logs) / len(logs)), common)
            continue
        both = dict(whole.filter(pl.col("family") == family).select("cluster", "peak").iter_rows())
        if both.get(source) and both.get(target):
            out[family] = (both[source] / both[target], [f"all {family}"])
    return out


def cluster_ratios(rates: pl.DataFrame, source: str, target: str, families: Iterable[str]) -> dict[str, ClusterRatio]:
    """The ratio rule of the module docstring for each of ``families`` that has one (``rates``:
    ``sample_rates`` rows)."""
    own = _peak_ratios(rates, source, target)
    compute = [f for f in own if f in COMPUTE_BOUND]
    memory = [f for f in own if f not in COMPUTE_BOUND and f != "comm"]

    def pooled(names: list[str]) -> float:
        return math.exp(sum(math.log(own[f][0]) for f in names) / len(names))

    out = {}
    for family in families:
        if family in own:
            unit = "FLOP/s" if family in COMPUTE_BOUND else "bytes/s"
            out[family] = ClusterRatio(family, own[family][0], f"peak {unit} of {', '.join(own[family][1])} samples")
        elif family == "comm":
            continue
        elif family in COMPUTE_BOUND and compute:
            out[family] = ClusterRatio(family, pooled(compute), f"peak FLOP/s of {', '.join(compute)} samples")
        elif family not in COMPUTE_BOUND and memory:
            out[family] = ClusterRatio(family, pooled(memory), f"peak bytes/s of {', '.join(memory)} samples")
    return out


def _effective_source(prediction: Prediction) -> np.ndarray:
    """Per node, where its duration came from; a collective member takes its instance's source."""
    nodes = prediction.graph.nodes
    source = prediction.durations.source.copy()
    inst = nodes.filter(pl.col("node_kind") == "collective").select("match_id", pl.col("node").alias("_inst"))
    members = nodes.filter((pl.col("node_kind") == "activity") & pl.col("match_id").is_not_null())
    members = members.select("node", "match_id").join(inst, on="match_id", how="inner")
    source[members["node"].to_numpy()] = source[members["_inst"].to_numpy()]
    return source


def _kept_activities(prediction: Prediction) -> pl.DataFrame:
    """Activities whose replayed duration is their measured one because nothing predicted it: rank,
    what (the family, or a collective as ``name role nodes×gpus``), start_ns, end_ns, dur_ns."""
    graph = prediction.graph
    nodes = graph.nodes.with_columns(pl.Series("_source", _effective_source(prediction)))
    wanted = ("collective", "nodes", "gpus_per_node")
    cols = [c for c in wanted if c in graph.features.columns]
    nodes = nodes.join(graph.features.select("node", *cols), on="node", how="left", maintain_order="left")
    nodes = nodes.with_columns(pl.lit(None, pl.String).alias(c) for c in wanted if c not in cols)
    topology = (
        pl.when(pl.col("nodes").is_not_null())
        .then(pl.format(" {}×{}", pl.col("nodes"), pl.col("gpus_per_node").fill_null(0)))
        .otherwise(pl.lit(""))
    )
    what = (
        pl.when(pl.col("collective").is_not_null())
        .then(pl.format("{} {}", pl.col("collective"), pl.col("role").fill_null("comm")) + topology)
        .otherwise(pl.col("family").fill_null("other"))
    )
    return nodes.filter(
        (pl.col("node_kind") == "activity")
        & pl.col("duration_role").is_in(["own", "coupled"])
        & (pl.col("_source") == "measured")
        & (pl.col("dur_ns") > 0)
    ).select("rank", what.alias("what"), "start_ns", "end_ns", "dur_ns")


def measured_fallback(prediction: Prediction) -> pl.DataFrame:
    """What kept its measured duration in a prediction, each with its share of the iteration on the
    rank where that share is largest: what, rank, kept_ms, share_pct (largest first). The rank
    ``total`` row is the union of them all on the rank where that is largest."""
    schema = {"what": pl.String, "rank": pl.Int64, "kept_ms": pl.Float64, "share_pct": pl.Float64}
    kept = _kept_activities(prediction)
    if kept.height == 0:
        return pl.DataFrame(schema=schema)
    spans = rank_spans(prediction.graph, prediction.graph.measured_times).select(
        "rank", (pl.col("end_ns") - pl.col("start_ns")).alias("_span")
    )
    per = (
        kept.group_by("rank", "what")
        .agg((pl.col("dur_ns").sum() / 1e6).alias("kept_ms"))
        .join(spans.with_columns(pl.col("rank").cast(kept.schema["rank"])), on="rank", how="inner")
        .with_columns((100.0 * pl.col("kept_ms") * 1e6 / pl.col("_span")).clip(upper_bound=100.0).alias("share_pct"))
        .sort("share_pct", descending=True)
        .group_by("what", maintain_order=True)
        .first()
    )
    totals = []
    for (rank,), part in kept.group_by("rank"):
        span = spans.filter(pl.col("rank") == rank)["_span"]
        if span.len() == 0 or not span[0]:
            continue
        busy = breakdown(
            (int(part["start_ns"].to_numpy().min()), int(part["end_ns"].to_numpy().max())),
            part["start_ns"].to_numpy(),
            part["end_ns"].to_numpy(),
            np.zeros(part.height, dtype=np.int64),
        )[:-1].sum()
        totals.append({"what": "total", "rank": rank, "kept_ms": busy / 1e6, "share_pct": 100.0 * busy / span[0]})
    total = pl.DataFrame(totals, schema=schema).sort("share_pct", descending=True).head(1)
    return pl.concat([per.select(list(schema)).cast(schema), total.cast(schema)])  # type: ignore[arg-type]


def idle_share(prediction: Prediction) -> float:
    """The largest share (%) of a rank's predicted iteration in which none of its operators ran: the
    time the gaps carried over from the trace (and the waits for other ranks) take."""
    comps = prediction.components
    idle = comps.filter(pl.col("component") == "idle").select("rank", pl.col("predicted_ns").alias("_idle"))
    it = comps.filter(pl.col("component") == "iteration").select("rank", "predicted_ns")
    share = it.join(idle, on="rank").select((100.0 * pl.col("_idle") / pl.col("predicted_ns")).max()).item()
    return float(share or 0.0)


def uncovered_families(coverage: dict[str, float]) -> list[str]:
    """Families (of a prediction's ``coverage``) with no operator time predicted by a model."""
    return sorted(f for f, share in coverage.items() if f != "all" and share == 0.0)

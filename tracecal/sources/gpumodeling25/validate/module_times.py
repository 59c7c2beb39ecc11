"""Measured and replayed module times: the GPU span of each module occurrence, averaged per rank.

A module occurrence is a CPU frame and the GPU activities launched inside it (``module_scope_members``
query, ``modules``). Its time is last end minus first start of those activities, on
the measured timeline and on the replayed one; a rank's module time is the mean over occurrences, as
the published measurements define it.
"""

from __future__ import annotations

import duckdb
import polars as pl

from tracecal.predict.run import Prediction
from tracecal.sources.gpumodeling25.validate.modules import ANY_MODULE, module_of
from tracecal.sql.query_files import query_frame


def module_members(con: duckdb.DuckDBPyConnection, run_id: str, iteration: int) -> pl.DataFrame:
    """The GPU activities of an iteration launched inside module frames (``module_scope_members``)."""
    return query_frame(con, "module_scope_members", [run_id, iteration, ANY_MODULE])


def module_times(members: pl.DataFrame, prediction: Prediction) -> pl.DataFrame:
    """``members`` (rank, scope_id, scope_name, event_id) -> per rank and module: occurrences,
    measured_us and predicted_us (mean span over occurrences)."""
    schema = {
        "rank": pl.Int32,
        "module": pl.String,
        "occurrences": pl.UInt32,
        "measured_us": pl.Float64,
        "predicted_us": pl.Float64,
    }
    if members.height == 0:
        return pl.DataFrame(schema=schema)
    nodes = prediction.graph.nodes.filter(pl.col("node_kind") == "activity").select("rank", "event_id", "node")
    joined = members.join(nodes, on=["rank", "event_id"], how="inner")
    node = joined["node"].to_numpy()
    measured = prediction.graph.measured_times
    replayed = prediction.replayed
    names = joined["scope_name"].unique().to_list()
    modules = {n: module_of(n) for n in names}
    spans = (
        joined.with_columns(
            pl.col("scope_name").replace_strict(modules, return_dtype=pl.String).alias("module"),
            pl.Series("m_start", measured[2 * node]),
            pl.Series("m_end", measured[2 * node + 1]),
            pl.Series("p_start", replayed[2 * node]),
            pl.Series("p_end", replayed[2 * node + 1]),
        )
        .group_by("rank", "module", "scope_id")
        .agg(
            (pl.col("m_end").max() - pl.col("m_start").min()).alias("m"),
            (pl.col("p_end").max() - pl.col("p_start").min()).alias("p"),
        )
    )
    return (
        spans.group_by("rank", "module")
        .agg(
            pl.len().alias("occurrences"),
            (pl.col("m").mean() / 1e3).alias("measured_us"),
            (pl.col("p").mean() / 1e3).alias("predicted_us"),
        )
        .sort("rank", "module")
        .cast(schema)  # type: ignore[arg-type]
    )


def per_position(times: pl.DataFrame, ranks: list[int], column: str) -> dict[str, list[float]]:
    """``{module: [value at ranks[0], ranks[1], ...]}`` (0 where a rank has no occurrence), the
    ``[head, middle, tail]`` lists the published tables use when ``ranks`` are the traced ranks."""
    out: dict[str, list[float]] = {}
    for module in times["module"].unique().sort().to_list():
        sub = times.filter(pl.col("module") == module)
        by_rank = dict(zip(sub["rank"].to_list(), sub[column].to_list(), strict=True))
        out[module] = [float(by_rank.get(r, 0.0) or 0.0) for r in ranks]
    return out

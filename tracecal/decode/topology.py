"""Where a collective's ranks sit: nodes spanned and GPUs per node of its group (pure).

Ranks are placed node-major (``rank // gpus_per_node`` is the node). A point-to-point transfer spans
its two ends, not the whole process group it was issued on; a collective spans its group. These two
numbers pick the communication model's topology (``nodes x GPUs per node`` sweeps).
"""

from __future__ import annotations

import polars as pl


def group_topology(
    collectives: pl.DataFrame, gpus_per_node: int | None, *, world_size: int | None = None, nodes: int | None = None
) -> pl.DataFrame:
    """``collectives`` with ``nodes`` and ``gpus_per_node`` (Int32) of each instance's ranks; NULL when
    the GPUs per node are unknown. A group with no recorded ranks is the whole job (``nodes``, and
    ``gpus_per_node`` capped by the world size)."""
    if gpus_per_node is None or gpus_per_node <= 0:
        return collectives.with_columns(
            pl.lit(None, dtype=pl.Int32).alias("nodes"), pl.lit(None, dtype=pl.Int32).alias("gpus_per_node")
        )
    gpn = gpus_per_node
    group = pl.col("pg_ranks").str.json_decode(dtype=pl.List(pl.Int64))
    if "peer" in collectives.columns:
        pair = pl.concat_list(pl.col("rank").cast(pl.Int64), pl.col("peer").cast(pl.Int64))
        group = pl.when(pl.col("peer").is_not_null()).then(pair).otherwise(group)
    per_node = group.list.eval((pl.element() // gpn).unique_counts().max()).list.first()
    n_nodes = group.list.eval((pl.element() // gpn).n_unique()).list.first()
    whole_job = group.is_null()
    return collectives.with_columns(
        pl.when(whole_job).then(pl.lit(nodes)).otherwise(n_nodes).cast(pl.Int32).alias("nodes"),
        pl.when(whole_job)
        .then(pl.lit(min(gpn, world_size) if world_size else gpn))
        .otherwise(per_node)
        .cast(pl.Int32)
        .alias("gpus_per_node"),
    )

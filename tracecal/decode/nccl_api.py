"""Collective fields from NCCL's own NVTX ranges in Nsight traces (pure).

NCCL brackets each API call with an NVTX range (``ncclAllReduce``, ``ncclSend``, ...). The ingest keeps
them as ``user_annotation`` events with ``coll_name`` and, when the report recorded NCCL's typed
payloads, ``bytes`` (message size), ``pg_name`` (the communicator), ``group_size`` and the peer
(``dst_rank`` / ``src_rank``). A kernel gets them in one of two ways:

- an ungrouped call launches its kernel inside its own range: the innermost data range enclosing the
  launch on the launching thread;
- grouped calls (``ncclGroupStart``; ``ncclSend``/``ncclRecv`` per peer; ``ncclGroupEnd``, as
  PyTorch's all-to-all and batched p2p do) launch one kernel inside the outermost ``ncclGroupEnd``:
  the data ranges of that group on the thread, summed. A group's collective name is its members'
  when they agree; its size is what this rank sends when it both sends and receives (an all-to-all's
  S), else the members' total; unknown when a member has no size or the group launched several kernels.
"""

from __future__ import annotations

import polars as pl

from tracecal.decode.frames import nulls
from tracecal.decode.nesting import ENGINE, NameIndex, enclosing, names_like

NCCL_DATA_CALL = (
    r"^nccl(AllReduce|AllGather|ReduceScatter|Broadcast|Bcast|Reduce|Send|Recv|AlltoAll|AllToAll|Gather|Scatter)$"
)
"""NCCL API ranges that move data (``tracecal.sources.nsys.nvtx.NCCL_COLLECTIVES``)."""
_GROUP = r"^ncclGroup(Start|End)$"
NAME_PATTERNS = (NCCL_DATA_CALL, _GROUP)
"""The name regexes this module matches (``NameIndex`` matches them together)."""

FIELDS = {
    "coll_name": pl.Utf8,
    "bytes": pl.Int64,
    "pg_name": pl.Utf8,
    "group_size": pl.Int64,
    "src_rank": pl.Int64,
    "dst_rank": pl.Int64,
}
"""Fields returned per instance, each prefixed with ``n_``."""


def _empty(inst: pl.DataFrame) -> pl.DataFrame:
    """No NCCL range says anything (series, not a query plan: the usual case, Kineto traces)."""
    return pl.DataFrame(nulls({"n_" + c: t for c, t in FIELDS.items()}, inst.height))


def _single(col: str) -> pl.Expr:
    """The members' common value, NULL when they disagree or have none."""
    return pl.when(pl.col(col).drop_nulls().n_unique() == 1).then(pl.col(col).drop_nulls().first())


def nccl_api_fields(events: pl.DataFrame, inst: pl.DataFrame, names: NameIndex | None = None) -> pl.DataFrame:
    """Per instance (``uid`` with ``rank``, ``cpu_pid``, ``cpu_tid``, ``launch_ns``; row i is ``inst``'s
    row i): the ``n_*`` fields of the NCCL API call (or group of calls) that launched it; NULL where
    no NCCL range says.

    Args:
        events: the ranks' events with ``end_ns`` and ``uid``.
        inst: collective instances (one row per uid).
        names: the batch's name index.
    """
    if names is not None and not names.any_like(NCCL_DATA_CALL):
        return _empty(inst)  # no NCCL range in the batch: no query plan over its events
    # lazy plans around the two sweeps: each eager frame operation has a fixed cost
    # one filter each (a name mask has the events' rows)
    nvtx = pl.col("kind") == "user_annotation"
    data = (
        events.lazy()
        .filter(nvtx & names_like(events, NCCL_DATA_CALL, names) & pl.col("coll_name").is_not_null())
        .collect(engine=ENGINE)
    )
    if data.height == 0:
        return _empty(inst)
    lane = ("rank", "pid", "tid")
    pts_lazy = inst.lazy().filter(pl.col("launch_ns").is_not_null() & pl.col("cpu_tid").is_not_null()).select(
        "rank", pl.col("cpu_pid").alias("pid"), pl.col("cpu_tid").alias("tid"), pl.col("uid").alias("qid"),
        pl.col("launch_ns").alias("t"),
    )  # fmt: skip
    cols = [pl.col(c).cast(t) for c, t in FIELDS.items()]
    # grouped: number the outermost groups on each thread (a GroupStart taking the depth from 0 to 1
    # opens one); members are the data ranges inside, the GroupEnd bringing the depth back to 0 launches
    seq_lazy = (
        pl.concat(
            [
                events.lazy().filter(nvtx & names_like(events, _GROUP, names)).select(
                    *lane, "uid", "ts_ns", "end_ns", "event_id",
                    pl.when(pl.col("name") == "ncclGroupStart").then(1).otherwise(-1).alias("_d"),
                ),
                data.lazy().select(*lane, "uid", "ts_ns", "end_ns", "event_id", pl.lit(0).alias("_d")),
            ],
            how="vertical_relaxed",
        )
        .sort(*lane, "ts_ns", "event_id")
        .with_columns(pl.col("_d").cum_sum().over(lane).alias("_walk"))
        # depth of open groups, an end without its start (the capture began inside a group) ignored:
        # the walk reflected at 0
        .with_columns((pl.col("_walk") - pl.col("_walk").cum_min().over(lane).clip(upper_bound=0)).alias("_depth"))
        .with_columns(((pl.col("_d") == 1) & (pl.col("_depth") == 1)).cum_sum().over(lane).alias("_group"))
    )  # fmt: skip
    pts, seq = pl.collect_all([pts_lazy, seq_lazy], engine=ENGINE)
    # ungrouped: the data range around the launch
    own = enclosing(data.select(*lane, pl.col("uid").alias("id"), "ts_ns", "end_ns"), pts, lane=lane).lazy()
    own = own.join(data.lazy().select(pl.col("uid").alias("id"), *cols), on="id", how="inner").drop("id", "depth")
    members = (
        seq.lazy()
        .filter((pl.col("_d") == 0) & (pl.col("_depth") > 0))
        .join(data.lazy().select("uid", *cols), on="uid", how="left")
    )
    sends = pl.col("coll_name") == "send"
    mixed = sends.any() & (pl.col("coll_name") == "recv").any()
    groups = members.group_by(*lane, "_group").agg(
        _single("coll_name").alias("coll_name"),
        pl.when(mixed).then(pl.col("bytes").filter(sends).sum()).otherwise(pl.col("bytes").sum()).alias("bytes"),
        (pl.col("bytes").null_count() > 0).alias("_partial"),
        _single("pg_name").alias("pg_name"),
        _single("group_size").alias("group_size"),
        _single("src_rank").alias("src_rank"),
        _single("dst_rank").alias("dst_rank"),
    )
    # a member without a size leaves the group's size unknown, not too small
    groups = groups.with_columns(pl.when(~pl.col("_partial")).then(pl.col("bytes")).alias("bytes")).drop("_partial")
    ends = seq.filter((pl.col("_d") == -1) & (pl.col("_depth") == 0))
    hit = enclosing(ends.select(*lane, pl.col("uid").alias("id"), "ts_ns", "end_ns"), pts, lane=lane)
    grouped = (
        hit.lazy()
        .filter(pl.col("id").is_not_null())
        .join(ends.lazy().select(pl.col("uid").alias("id"), *lane, "_group"), on="id", how="inner")
        .join(groups, on=[*lane, "_group"], how="inner")
        # several kernels launched by one group share its calls in a way the ranges do not say
        .with_columns(pl.when(pl.len().over("id") == 1).then(pl.col("bytes")).alias("bytes"))
        .select("qid", *cols)
    )
    found = pl.concat([own, grouped.join(own.select("qid"), on="qid", how="anti")], how="vertical_relaxed")
    found = found.rename({"qid": "uid", **{c: "n_" + c for c in FIELDS}})
    found = inst.lazy().select("uid").join(found, on="uid", how="left", maintain_order="left")
    return found.drop("uid").collect(engine=ENGINE)

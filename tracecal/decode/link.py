"""Link GPU activity to the runtime call and CPU operator that issued it (one rank, pure).

Rules (docs/decode.md#linking):

- kernel / memcpy / memset -> runtime call by ``correlation`` (CUPTI correlation id; Kineto and Nsight);
- runtime call -> CPU operator by ``External id`` when a ``cpu_op`` carries that id and encloses the
  call on the same thread; otherwise the innermost ``cpu_op`` enclosing the call on the same thread by
  time (Nsight has no external ids; Kineto uses correlation-valued ids for some launches);
- a GPU activity without a runtime call (sampled traces) -> CPU operator by its own External id;
- otherwise unlinked: kept, with ``link = 'none'``.

CPU-only traces (no GPU activity): the operators are the leaf CPU operators (no ``cpu_op`` nested in
them) plus the asynchronous ``gloo:*`` work ranges, each its own CPU operator (``link = 'self'``).

The frame returned here has the identity and linking columns of ``schema.OPERATORS`` plus helper
columns used by the later steps (``cpu_pid``, ``launch_ns``, ``cpu_fwd_thread_id``,
``cpu_concrete_inputs``); ``classify`` and ``shapes`` fill the rest.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracecal.decode.frames import coalesce, picked, taken
from tracecal.decode.nesting import ENGINE, NameIndex, enclosing, launch_points, names_like, parents, rows_of
from tracecal.vocabulary import GPU_ACTIVITY_KINDS, RUNTIME_KINDS

PROFILER_STEP = r"^ProfilerStep#(\d+)$"
"""Profiler step ranges: the text of ``iterations.DEFAULT_MARKER`` (the group changes nothing about
what matches), so a batch compiles and matches the pattern once."""
CPU_COMM_WORK = r"^gloo:"
METADATA_OPS = (
    r"^aten::(view|_unsafe_view|view_as|empty|empty_strided|empty_like|new_empty|new_empty_strided|as_strided"
    r"|reshape|_reshape_alias|expand|expand_as|t|transpose|permute|unsqueeze|squeeze|select|slice|narrow|detach"
    r"|detach_|alias|resolve_conj|resolve_neg|contiguous|result_type|size|stride|is_nonzero|item"
    r"|_local_scalar_dense|lift_fresh|split|split_with_sizes|chunk|unbind|flatten|unflatten|to|numpy_T"
    r"|_has_compatible_shallow_copy_type|set_|_nested_tensor_from_mask_left_aligned)$"
)
"""CPU operators that only build tensor metadata or allocate: on CPU-only ranks they are not operators
(a matmul that calls ``aten::empty`` for its output is still the leaf that did the work)."""
"""Names of CPU ranges that are the communication work itself (gloo runs it on its own threads)."""


NAME_PATTERNS = (PROFILER_STEP, METADATA_OPS, CPU_COMM_WORK)
"""The name regexes this module matches (``NameIndex`` matches them together)."""


UID_SHIFT = 40
"""``uid = rank << 40 | event_id``: one int64 key for an event across the ranks of a batch."""


def uid_expr(rank: str = "rank", event_id: str = "event_id") -> pl.Expr:
    """The batch-wide event key (ranks below 2^23, event ids below 2^40)."""
    return pl.col(rank).cast(pl.Int64) * (1 << UID_SHIFT) + pl.col(event_id)


END_NS = (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns")
"""An event's end (``ts_ns + dur_ns``; a missing duration counts as an instant)."""


def with_end(events: pl.DataFrame) -> pl.DataFrame:
    """Events plus ``end_ns`` (``END_NS``) and ``uid``."""
    return events.with_columns(END_NS, uid_expr().alias("uid"))


def uid_series(events: pl.DataFrame) -> pl.Series:
    """``uid_expr`` as a series operation (no query plan)."""
    return (events.get_column("rank").cast(pl.Int64) * (1 << UID_SHIFT) + events.get_column("event_id")).alias("uid")


def end_series(events: pl.DataFrame) -> pl.Series:
    """``END_NS`` as a series operation (no query plan)."""
    ts = events.get_column("ts_ns")
    return coalesce(ts + events.get_column("dur_ns"), ts).alias("end_ns")


def _cpu_ops(events: pl.DataFrame, names: NameIndex | None = None, but: tuple[str, ...] = ()) -> pl.LazyFrame:
    """The ``cpu_op`` events but profiler steps, and but names matching ``but``: one filter (a name
    mask has the events' rows)."""
    kept = (pl.col("kind") == "cpu_op") & ~names_like(events, PROFILER_STEP, names)
    for pattern in but:
        kept = kept & ~names_like(events, pattern, names)
    return events.lazy().filter(kept)


_CPU_COLS = {
    "event_id": "cpu_op_event_id",
    "name": "cpu_op_name",
    "ts_ns": "cpu_op_ts_ns",
    "dur_ns": "cpu_op_dur_ns",
    "input_dims": "input_dims",
    "input_types": "input_types",
    "concrete_inputs": "cpu_concrete_inputs",
    "sequence_number": "sequence_number",
    "fwd_thread_id": "cpu_fwd_thread_id",
}


def link_gpu_operators(events: pl.DataFrame, names: NameIndex | None = None) -> pl.DataFrame:
    """One row per GPU activity, linked to its runtime call and innermost CPU operator.

    Args:
        events: the events of one or more ranks (``schema.EVENTS`` columns) plus ``end_ns`` and
            ``uid`` (see ``with_end``); every link stays within a rank.

    Returns:
        Columns: rank, uid, event_id, kind, name, ts_ns, dur_ns, device, stream, correlation, runtime_event_id,
        runtime_name, runtime_ts_ns, runtime_dur_ns, cpu_pid, cpu_tid, cpu_op_event_id, cpu_op_name,
        cpu_op_ts_ns, cpu_op_dur_ns, input_dims, input_types, cpu_concrete_inputs, sequence_number,
        cpu_fwd_thread_id, link, launch_ns (when the CPU issued the work: the runtime call's start,
        else the CPU operator's start; NULL when unlinked).
    """
    # one lazy plan before the one sweep, series operations after it: each eager frame operation has a fixed cost
    lev = events.lazy()
    gpu = lev.filter(pl.col("kind").is_in(GPU_ACTIVITY_KINDS)).select(
        "rank",
        "uid",
        "event_id",
        "kind",
        "name",
        "ts_ns",
        "dur_ns",
        "device",
        "stream",
        "correlation",
        pl.col("external_id").alias("_gpu_ext"),
    )
    runtime = (
        lev.filter(pl.col("kind").is_in(RUNTIME_KINDS) & pl.col("correlation").is_not_null())
        .sort("uid")  # no work when sorted (as decode hands them over)
        .filter(pl.struct("rank", "correlation").is_first_distinct())  # a ``unique`` costs twice as much
        .select(
            "rank",
            "correlation",
            pl.col("event_id").alias("runtime_event_id"),
            pl.col("name").alias("runtime_name"),
            pl.col("ts_ns").alias("runtime_ts_ns"),
            pl.col("dur_ns").alias("runtime_dur_ns"),
            pl.col("pid").alias("cpu_pid"),
            pl.col("tid").alias("cpu_tid"),
            pl.col("external_id").alias("_rt_ext"),
        )
    )
    ops_lazy = gpu.join(runtime, on=["rank", "correlation"], how="left")
    cpu_lazy = _cpu_ops(events, names)
    cpu_by_ext = (
        cpu_lazy.filter(pl.col("external_id").is_not_null() & (pl.col("external_id") != 0))
        .sort("uid")
        .filter(pl.struct("rank", "external_id").is_first_distinct())
        .select(
            "rank",
            pl.col("external_id").alias("_ext"),
            pl.col("event_id").alias("_ext_op"),
            pl.col("pid").alias("_ext_pid"),
            pl.col("tid").alias("_ext_tid"),
            pl.col("ts_ns").alias("_ext_ts"),
            pl.col("end_ns").alias("_ext_end"),
        )
    )
    # External id 0 means "none" in Kineto
    ext = pl.coalesce(pl.col("_rt_ext").replace(0, None), pl.col("_gpu_ext").replace(0, None))
    ops_lazy = ops_lazy.with_columns(ext.alias("_ext")).join(cpu_by_ext, on=["rank", "_ext"], how="left")
    has_rt = pl.col("runtime_event_id").is_not_null()
    # an External id link is trusted only if the operator encloses the runtime call on its thread
    ext_ok = pl.col("_ext_op").is_not_null() & (
        ~has_rt
        | (
            (pl.col("_ext_tid") == pl.col("cpu_tid"))
            & (pl.col("_ext_ts") <= pl.col("runtime_ts_ns"))
            & (pl.col("runtime_ts_ns") < pl.col("_ext_end"))
        )
    )
    ops_lazy = ops_lazy.with_columns(pl.when(ext_ok).then(pl.col("_ext_op")).alias("_ext_op"))
    ops, cpu = pl.collect_all([ops_lazy, cpu_lazy], engine=ENGINE)
    # time fallback: innermost cpu_op enclosing the runtime call on the same thread; then every
    # answer is put back by row, and the CPU operator's columns taken by row (series operations and
    # numpy: the joins and the plan of this step would cost more than the rows it handles)
    ext_op = ops.get_column("_ext_op")
    by_ext = ext_op.is_not_null()
    unlinked = (~by_ext & ops.get_column("runtime_event_id").is_not_null()).to_numpy()
    need = picked(ops, {"rank": "rank", "cpu_pid": "pid", "cpu_tid": "tid", "runtime_ts_ns": "t"}, pl.Series(unlinked))
    need = need.hstack([pl.Series("qid", np.flatnonzero(unlinked), dtype=pl.Int64)])  # query id: row of ``ops``
    lanes = {"rank": "rank", "pid": "pid", "tid": "tid"}
    intervals = picked(cpu, {**lanes, "event_id": "id", "ts_ns": "ts_ns", "end_ns": "end_ns"})
    found = enclosing(intervals, need, lane=("rank", "pid", "tid"))
    hit = found.get_column("id").is_not_null()
    timed = np.zeros(ops.height, dtype=bool)
    time_op = np.zeros(ops.height, dtype=np.int64)
    at = found.get_column("qid").filter(hit).to_numpy()
    timed[at], time_op[at] = True, found.get_column("id").filter(hit).to_numpy()
    by_time = pl.Series(time_op)
    cpu_op = coalesce(ext_op, by_time if timed.all() else by_time.set(pl.Series(~timed), None))
    link = pl.Series(["external_id", "time", "none"]).gather(np.where(by_ext.to_numpy(), 0, np.where(timed, 1, 2)))
    # the CPU operator's row in ``cpu`` (uids are unique; NULL row for none)
    has_op = cpu_op.is_not_null()
    op_uid = ops.get_column("rank").filter(has_op).cast(pl.Int64) * (1 << UID_SHIFT) + cpu_op.filter(has_op)
    row = np.full(ops.height, -1, dtype=np.int64)
    row[has_op.to_numpy()] = rows_of(cpu.get_column("uid").to_numpy(), op_uid.to_numpy())
    op_columns = {src: dst for src, dst in _CPU_COLS.items() if src != "event_id"}
    of_op = taken(picked(cpu, {**op_columns, "pid": "_op_pid", "tid": "_op_tid"}), row)
    runtime_ts = ops.get_column("runtime_ts_ns")
    out = pl.DataFrame(
        [
            *(ops.get_column(c) for c in ("rank", "uid", "event_id", "kind", "name", "ts_ns", "dur_ns", "device")),
            *(ops.get_column(c) for c in ("stream", "correlation", "runtime_event_id", "runtime_name")),
            runtime_ts,
            ops.get_column("runtime_dur_ns"),
            coalesce(ops.get_column("cpu_pid"), of_op.get_column("_op_pid")),
            coalesce(ops.get_column("cpu_tid"), of_op.get_column("_op_tid")),
            cpu_op.alias("cpu_op_event_id"),
            *of_op.drop("_op_pid", "_op_tid").get_columns(),
            link.alias("link"),
            coalesce(runtime_ts, of_op.get_column("cpu_op_ts_ns")).alias("launch_ns"),
        ]
    )
    return out if out.get_column("uid").is_sorted() else out.sort("uid")


def cpu_leaf_operators(events: pl.DataFrame, names: NameIndex | None = None) -> pl.DataFrame:
    """Operators of a CPU-only rank: leaf ``cpu_op`` events plus ``gloo:*`` work ranges.

    Leaves are taken after setting aside metadata-only operators (``METADATA_OPS``: views, empty,
    reshape, ...), which do no work of their own and would otherwise hide the matmul that calls them.

    Same columns as ``link_gpu_operators``; the CPU operator of each row is the row itself.
    """
    cpu = _cpu_ops(events, names, but=(METADATA_OPS,)).collect(engine=ENGINE)
    par = parents(
        cpu.select("rank", "pid", "tid", pl.col("uid").alias("id"), "ts_ns", "end_ns"), lane=("rank", "pid", "tid")
    )
    has_child = par.lazy().filter(pl.col("parent_id").is_not_null()).select(pl.col("parent_id").alias("uid")).unique()
    leaves = cpu.lazy().join(has_child, on="uid", how="anti")
    work = events.lazy().filter((pl.col("kind") == "user_annotation") & names_like(events, CPU_COMM_WORK, names))
    rows = pl.concat([leaves, work], how="vertical_relaxed").sort("uid")
    return rows.select(
        "rank",
        "uid",
        "event_id",
        "kind",
        "name",
        "ts_ns",
        "dur_ns",
        "device",
        "stream",
        "correlation",
        pl.lit(None, dtype=pl.Int64).alias("runtime_event_id"),
        pl.lit(None, dtype=pl.Utf8).alias("runtime_name"),
        pl.lit(None, dtype=pl.Int64).alias("runtime_ts_ns"),
        pl.lit(None, dtype=pl.Int64).alias("runtime_dur_ns"),
        pl.col("pid").alias("cpu_pid"),
        pl.col("tid").alias("cpu_tid"),
        *[pl.col(src).alias(dst) for src, dst in _CPU_COLS.items()],
        pl.lit("self").alias("link"),
        pl.col("ts_ns").alias("launch_ns"),
    ).collect(engine=ENGINE)


def outermost_scope(
    events: pl.DataFrame, operators: pl.DataFrame, exclude: str = PROFILER_STEP, names: NameIndex | None = None
) -> pl.DataFrame:
    """``operators`` plus ``scope_name``: the outermost user annotation enclosing the launch on its thread.

    One plan picks the annotations; the rest are series operations on the rows of ``operators``
    (query id = row number, so no join brings the answer back), which saves two joins and a second
    collect, all fixed cost.

    Args:
        events: the rank's events with ``end_ns``.
        operators: frame with ``rank``, ``uid``, ``cpu_pid``, ``cpu_tid``, ``launch_ns``.
        exclude: regex of annotation names that are not framework scopes (iteration markers).
    """
    iv = (
        events.lazy()
        .filter(
            (pl.col("kind") == "user_annotation")
            & ~names_like(events, exclude, names)
            & ~names_like(events, CPU_COMM_WORK, names)
        )
        .select("rank", "pid", "tid", pl.col("uid").alias("id"), "ts_ns", "end_ns", "name")
        .collect(engine=ENGINE)
    )
    hit = enclosing(iv, launch_points(operators), lane=("rank", "pid", "tid"), outermost=True)
    # per operator row: the row of its scope in ``iv`` (enclosing answers with the annotations' uids)
    ids = hit.get_column("id")
    in_scope = ids.is_not_null()
    scope_row = np.full(operators.height, -1, dtype=np.int64)
    scope_row[hit.get_column("qid").filter(in_scope).to_numpy()] = rows_of(
        iv.get_column("id").to_numpy(), ids.filter(in_scope).to_numpy()
    )
    at = pl.Series(scope_row)
    scope = iv.get_column("name").gather(at.set(at < 0, None) if (scope_row < 0).any() else at)
    return operators.hstack([scope.alias("scope_name")])

"""Collective and point-to-point instances of one rank, with size, group, role and bandwidth (pure).

An instance is an NCCL/RCCL kernel (``ncclKernel_*``, ``ncclDevKernel_*``) in GPU traces, or a gloo
work range (``gloo:all_reduce``) in CPU-only traces. Its attributes come, first found wins, from
the kernel's own collective args (newest Kineto), the enclosing ``record_param_comms`` operator, NCCL's
own NVTX ranges in Nsight traces (``ncclAllReduce``, or the ``ncclSend``/``ncclRecv`` of a group:
``tracecal.decode.nccl_api``), the enclosing ``nccl:*`` annotation (older traces put Input Dims
there), and the enclosing ``c10d::`` operator, all on the launching thread at the launch time. The
instance's own name says which collective it is before any of them (a ``SendRecv`` kernel does
not say). A gloo range is its own annotation: it takes nothing from another gloo range.

Bandwidths follow nccl-tests: algbw = S / t; busbw = algbw × 2(n−1)/n for all-reduce, (n−1)/n for
all-gather, reduce-scatter and all-to-all (S the total size), 1 for broadcast, reduce, send, recv.
Bytes per nanosecond are GB/s.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection

import numpy as np
import orjson
import polars as pl

from tracecal.decode import nccl_api
from tracecal.decode.frames import nulls, taken
from tracecal.decode.nccl_api import nccl_api_fields
from tracecal.decode.nesting import ENGINE, NameIndex, covered, enclosing, launch_points, names_like, rows_of
from tracecal.decode.shape_features import DTYPE_BYTES, normalize_dtype
from tracecal.ingest.input_dims import message_elements, output_elements
from tracecal.vocabulary import ParallelLayout

COMM_KERNEL = r"(?i)^(nccl|rccl)\w*Kernel|^ncclDevKernel|^ncclKernel"
CPU_WORK = r"^gloo:"
_ANNOTATION = r"^(nccl|gloo|rccl):"


_COLL_DTYPES = {"byte": "uint8", "char": "int8", "short": "int16", "int": "int32", "long": "int64"}


def _coll_dtype(raw: str | None) -> str | None:
    if not raw:
        return None
    return normalize_dtype(raw) or _COLL_DTYPES.get(raw.strip().lower())


def normalize_collective(raw: str | None) -> str | None:
    """A collective/kernel/annotation name -> all_reduce, all_gather, reduce_scatter, all_to_all,
    broadcast, reduce, send, recv, barrier; None when the name does not say (``SendRecv``, ``Generic``)."""
    if not raw:
        return None
    s = raw.lower()
    for prefix in ("nccl:", "gloo:", "rccl:", "c10d::"):
        if s.startswith(prefix):
            s = s[len(prefix) :]
    s = s.split("(")[0].replace("_", "").replace("ncclkernel", "").replace("nccldevkernel", "")
    if "sendrecv" in s:
        return None
    for key, name in (
        ("allreduce", "all_reduce"),
        ("reducescatter", "reduce_scatter"),
        ("allgather", "all_gather"),
        ("alltoall", "all_to_all"),
        ("broadcast", "broadcast"),
        ("barrier", "barrier"),
        ("send", "send"),
        ("recv", "recv"),
        ("reduce", "reduce"),
    ):
        if key in s:
            return name
    return None


def busbw_factor(name: str | None, n: int | None) -> float | None:
    """nccl-tests bus-bandwidth factor for a collective over ``n`` ranks; None when unknown."""
    if name is None or n is None or n < 1:
        return None
    if name == "all_reduce":
        return 2.0 * (n - 1) / n
    if name in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if name in ("broadcast", "reduce", "send", "recv"):
        return 1.0
    return None


def _first_type(types: str | None) -> str | None:
    if not types:
        return None
    try:
        value = orjson.loads(types)
    except orjson.JSONDecodeError:
        return None
    return normalize_dtype(value[0]) if isinstance(value, list) and value and isinstance(value[0], str) else None


def parse_ranks(text: str | None) -> list[int] | None:
    """``Process Group Ranks`` JSON text -> sorted list of global ranks (None if absent/unparseable)."""
    if not text:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        return sorted(value)
    return None


def role_of_group(ranks: list[int] | None, layout: ParallelLayout) -> str | None:
    """Role of a process group from its global ranks and the run's layout (docs/decode.md#components).

    Megatron orders ranks TP fastest, then DP, then PP: a TP group is ``tp`` consecutive ranks, a DP
    group ``dp`` ranks with stride ``tp``, a PP group ``pp`` ranks with stride ``tp·dp``. The
    alternative order (TP, then PP, then DP) is checked too; a group that fits neither is None.
    A group spanning the whole world is the role of the only parallel dimension larger than 1.
    """
    if not ranks or layout.tp is None or layout.dp is None or layout.pp is None:
        return None
    tp, dp, pp = layout.tp, layout.dp, layout.pp
    n = len(ranks)
    world = layout.world_size or tp * dp * pp
    if n == world:
        big = [r for r, size in (("tp", tp), ("dp", dp), ("pp", pp)) if size > 1]
        return big[0] if len(big) == 1 else None
    stride = ranks[1] - ranks[0] if n > 1 else None
    if stride is None or any(b - a != stride for a, b in itertools.pairwise(ranks)):
        return None
    for order in (("tp", "dp", "pp"), ("tp", "pp", "dp")):
        sizes = {"tp": tp, "dp": dp, "pp": pp}
        s = 1
        for axis in order:
            if sizes[axis] == n and s == stride and sizes[axis] > 1:
                return axis
            s *= sizes[axis]
    return None


SCOPE_ROLES = (
    ("tp", r"(?i)ModelParallelRegion|ColumnParallel|RowParallel|tensor_parallel"),
    ("pp", r"(?i)send_activations|recv_activations|send_grads|recv_grads|_exec_send|_exec_recv|p2p_communication"),
    ("dp", r"(?i)_exec_reduce_grads|reduce_grads|allreduce_gradients|grad_sync"),
    ("ep", r"(?i)\bmoe\b|expert"),
)
"""Framework scopes (any operator or annotation enclosing the launch on its thread) that say a
collective's role when its process group does not (docs/decode.md#components)."""
_DIRECTIONS = (("_next", r"(?i)send_activations|recv_grads"), ("_prev", r"(?i)recv_activations|send_grads"))
"""Pipeline scopes that say which neighbour stage a send/recv talks to."""


_CONTEXT = (
    ("r_", "cpu_op", r"^record_param_comms$"),
    ("a_", "user_annotation", _ANNOTATION),
    ("c_", "cpu_op", r"^c10d::"),
)
_COLLECTIVE_ARGS = [
    "coll_name",
    "in_msg_nelems",
    "out_msg_nelems",
    "group_size",
    "coll_dtype",
    "pg_name",
    "pg_ranks",
    "coll_seq",
    "input_dims",
    "input_types",
    "src_rank",
    "dst_rank",
]
"""Event columns that describe a collective; an instance reads them from itself and from its context."""
_ATTRS = ["name", *_COLLECTIVE_ARGS]
INSTANCE_PATTERNS = (COMM_KERNEL, CPU_WORK)
"""The name regexes that find instances (no name matches: the batch has no collective)."""
CONTEXT_PATTERNS = (
    *(p for _, _, p in _CONTEXT),
    *(p for _, p in SCOPE_ROLES),
    *(p for _, p in _DIRECTIONS),
    *nccl_api.NAME_PATTERNS,
)
"""The name regexes of the instances' context: only asked for when the batch has instances."""


def _lane_points(points: pl.DataFrame, tags: list[int]) -> pl.DataFrame:
    """``points`` asked once per lane ``tag``: row k·n + j (its ``qid``) is point j in lane ``tags[k]``."""
    k, n = len(tags), points.height
    return pl.DataFrame(
        [
            *(pl.concat([points.get_column(c)] * k) for c in ("rank", "pid", "tid", "t")),
            pl.Series("tag", np.repeat(np.array(tags, dtype=np.int8), n)),
            pl.Series("qid", np.arange(k * n, dtype=np.int64)),
        ]
    )


def _tagged(tag: str) -> list[str]:
    """The context columns of one kind: ``_ATTRS`` prefixed with its tag (``r_name``, ...)."""
    return [tag + c for c in _ATTRS]


def _context_attrs(events: pl.DataFrame, inst: pl.DataFrame, names: NameIndex | None) -> pl.DataFrame:
    """Collective args of the innermost record_param_comms (``r_``), nccl:/gloo: annotation (``a_``)
    and c10d:: op (``c_``) enclosing each instance's launch on its thread: one sweep, a lane per kind.

    Row i is ``inst``'s row i. One query plan (the lanes' ranges with their args, so the enclosing
    ranges' args are a row take, not a join against all events); the rest is numpy and frame takes.
    The other per-instance helpers return aligned rows too, so they are hstacked, not joined on uid.
    """
    attr_types = [events.schema[c] for c in _ATTRS]
    n = inst.height

    def unknown(tag: str) -> list[pl.Series]:
        return nulls(dict(zip(_tagged(tag), attr_types, strict=True)), n)

    active = [i for i, (_, _, pattern) in enumerate(_CONTEXT) if names is None or names.any_like(pattern)]
    if not active:  # no context names in the batch (a trace without record_param_comms, annotations, c10d)
        return pl.DataFrame([s for tag, _, _ in _CONTEXT for s in unknown(tag)])
    # lane ``tag``: the context's index (an integer sorts fast). The kinds' names are disjoint, so one
    # pass over the events tags them all, cheaper than a filter per kind
    lane_tag = pl.coalesce(
        pl.when((pl.col("kind") == _CONTEXT[i][1]) & names_like(events, _CONTEXT[i][2], names)).then(
            pl.lit(i, dtype=pl.Int8)
        )
        for i in active
    )
    iv = (
        events.lazy()
        .select("rank", "pid", "tid", lane_tag.alias("tag"), pl.col("uid").alias("id"), "ts_ns", "end_ns", *_ATTRS)
        .filter(pl.col("tag").is_not_null())
        .collect(engine=ENGINE)
    )
    points = launch_points(inst)
    rows = points.get_column("qid").to_numpy()
    found = enclosing(iv, _lane_points(points, active), lane=("rank", "pid", "tid", "tag"))
    # per point (``qid``), the enclosing range's row in ``iv`` (uids are unique); -1 for none
    ids = found.get_column("id")
    hit = ids.is_not_null()
    at = np.full(found.height, -1)
    at[found.get_column("qid").filter(hit).to_numpy()] = rows_of(
        iv.get_column("id").to_numpy(), ids.filter(hit).to_numpy()
    )
    # frame takes and numpy: no query plan (a series gather or extend runs one each)
    attrs = pl.DataFrame([iv.get_column(c) for c in _ATTRS])
    columns = []
    for i, (tag, _, _) in enumerate(_CONTEXT):
        if i not in active:
            columns += unknown(tag)
            continue
        k = active.index(i)
        row = np.full(n, -1)
        row[rows] = at[k * len(rows) : (k + 1) * len(rows)]
        lane_attrs = taken(attrs, row)
        lane_attrs.columns = _tagged(tag)
        columns += lane_attrs.get_columns()
    return pl.DataFrame(columns)


def layout_group(rank: int, role: str, layout: ParallelLayout) -> list[int] | None:
    """The global ranks of ``rank``'s ``role`` group under Megatron order (TP fastest, then DP, then PP)."""
    tp, dp, pp = layout.tp, layout.dp, layout.pp
    if tp is None or dp is None or pp is None or role not in ("tp", "dp", "pp"):
        return None
    pp_i, rest = divmod(rank, dp * tp)
    dp_i, tp_i = divmod(rest, tp)
    if role == "tp":
        return [pp_i * dp * tp + dp_i * tp + t for t in range(tp)]
    if role == "dp":
        return [pp_i * dp * tp + d * tp + tp_i for d in range(dp)]
    return [p * dp * tp + dp_i * tp + tp_i for p in range(pp)]


def _fifo_pairs(calls: list[tuple[int, int, object]], work: list[tuple[int, int, object]]) -> dict[int, int]:
    """Pair work ranges with the calls that enqueued them, first in first out, a range never before its call.

    ``calls`` and ``work`` are (ts_ns, row, key) triples; only equal keys pair. Returns work row -> call row.
    """
    queues: dict[object, list[int]] = {}
    heads: dict[object, int] = {}
    out: dict[int, int] = {}
    # calls before work at equal times: a range starts inside (or at the start of) its call
    for _ts, is_work, row, key in sorted([(t, 0, r, k) for t, r, k in calls] + [(t, 1, r, k) for t, r, k in work]):
        q = queues.setdefault(key, [])
        if not is_work:
            q.append(row)
            continue
        h = heads.get(key, 0)
        if h < len(q):
            out[row] = q[h]
            heads[key] = h + 1
    return out


def _link_cpu_work(events: pl.DataFrame, inst: pl.DataFrame) -> pl.DataFrame:
    """Give gloo work ranges the launch context of the ``c10d::`` operator that enqueued them.

    gloo runs collectives on its own threads (several of them: a range that started later may have
    been enqueued earlier), and a send's range outlasts the calls after it. Work is first in, first
    out per collective kind and message: a ``gloo:all_reduce`` range of 262144 elements is the oldest
    not yet started ``c10d::allreduce_`` call of 262144 elements before it. Ranges whose message the
    calls do not show (or show differently: an all-gather's output list) pair by kind alone in a
    second pass, with the calls left over. A range with no call before it (enqueued before the
    capture) has no launch.

    Python lists after one query plan (the calls and the ranges' Input Dims): a gloo rank has tens
    of ranges and calls, fewer than a frame operation's fixed cost is worth.
    """
    is_call = (pl.col("kind") == "cpu_op") & pl.col("name").str.starts_with("c10d::")
    found = (
        events.lazy()
        .filter(is_call | pl.col("uid").is_in(inst.get_column("uid").implode()))
        .select(is_call.alias("_call"), "uid", "rank", "name", "ts_ns", "pid", "tid", "input_dims")
        .collect(engine=ENGINE)
    )
    calls = [row for row in found.iter_rows(named=True) if row["_call"]]  # in event order, as captured
    dims_of = dict(zip(found.get_column("uid").to_list(), found.get_column("input_dims").to_list(), strict=True))
    own = {c: inst.get_column(c).to_list() for c in ("uid", "rank", "name", "ts_ns", "launch_ns", "cpu_pid", "cpu_tid")}
    work = [
        {"rank": rank, "name": name, "ts_ns": ts, "input_dims": dims_of.get(uid)}
        for uid, rank, name, ts in zip(own["uid"], own["rank"], own["name"], own["ts_ns"], strict=True)
    ]
    kinds = {n: normalize_collective(n) or n for n in {x["name"] for x in calls + work}}
    # the message is the input's elements, by the operator's signature (tensor lists summed):
    # ``[[262144]]`` on the range, ``[[[262144]],[],...]`` on the call
    elems = {
        (x["name"], x["input_dims"]): message_elements(x["name"], x["input_dims"])
        for x in calls + work
        if x["input_dims"] is not None
    }

    def by_rank(rows: list[dict]) -> dict[int, list[tuple[int, int, str, int | None]]]:
        """(ts_ns, row, kind, elements) of the rows, per rank."""
        out: dict[int, list[tuple[int, int, str, int | None]]] = {}
        for i, x in enumerate(rows):
            size = elems.get((x["name"], x["input_dims"]))
            out.setdefault(x["rank"], []).append((x["ts_ns"], i, kinds[x["name"]], size))
        return out

    calls_of = by_rank(calls)
    pairs: dict[int, int] = {}
    for rank, wrows in by_rank(work).items():
        crows = calls_of.get(rank, [])
        first = _fifo_pairs([(t, r, (k, e)) for t, r, k, e in crows], [(t, r, (k, e)) for t, r, k, e in wrows])
        used = set(first.values())
        second = _fifo_pairs(
            [(t, r, k) for t, r, k, _ in crows if r not in used], [(t, r, k) for t, r, k, _ in wrows if r not in first]
        )
        pairs.update(first)
        pairs.update(second)
    # on a rank whose calls were recorded, a range without one was enqueued before the capture: no
    # launch (so not numbered for matching, as for kernels launched before it); without any calls
    # (a trace that does not record them) a range stands for its own launch
    launch, pid, tid = [], [], []
    for i, (rank, own_launch, own_pid, own_tid) in enumerate(
        zip(own["rank"], own["launch_ns"], own["cpu_pid"], own["cpu_tid"], strict=True)
    ):
        by = calls[pairs[i]] if i in pairs else None
        launch.append((by["ts_ns"] if by else None) if rank in calls_of else own_launch)
        pid.append(by["pid"] if by and by["pid"] is not None else own_pid)
        tid.append(by["tid"] if by and by["tid"] is not None else own_tid)
    linked = {"launch_ns": launch, "cpu_pid": pid, "cpu_tid": tid}
    schema = inst.schema
    return pl.DataFrame(
        [pl.Series(c, linked[c], dtype=schema[c]) if c in linked else inst.get_column(c) for c in inst.columns]
    )


def _scope_evidence(events: pl.DataFrame, inst: pl.DataFrame, names: NameIndex | None) -> pl.DataFrame:
    """Per instance (row i is ``inst``'s row i): the first role of ``SCOPE_ROLES`` whose scope
    encloses the launch on its thread (``scope_role``), and the pipeline direction (``_next`` /
    ``_prev`` booleans; NULL for a launch no scope of any set encloses, as the role)."""
    sets = [*SCOPE_ROLES, *_DIRECTIONS]
    # sets no name of the batch matches cover nothing: skip them (most GPU traces have no such scopes)
    active = [i for i, (_, pat) in enumerate(sets) if names is None or names.any_like(pat)]
    n = inst.height
    if not active:
        return pl.DataFrame(nulls({"scope_role": pl.Utf8, "_next": pl.Boolean, "_prev": pl.Boolean}, n))
    scope = pl.col("kind").is_in(["cpu_op", "user_annotation", "python_function", "nvtx"])
    # lane ``tag``: the set's index in ``sets`` (an integer sorts fast; roles come first, in priority
    # order); one filter per set (a name mask has the events' rows)
    iv = pl.concat(
        [
            events.lazy()
            .filter(scope & names_like(events, pat, names))
            .select(
                "rank",
                "pid",
                "tid",
                pl.lit(i, dtype=pl.Int8).alias("tag"),
                pl.col("uid").alias("id"),
                "ts_ns",
                "end_ns",
            )
            for i, (_, pat) in enumerate(sets)
            if i in active
        ],
        how="vertical_relaxed",
    ).collect(engine=ENGINE)
    points = launch_points(inst)
    rows = points.get_column("qid").to_numpy()
    cov = covered(iv, _lane_points(points, active), lane=("rank", "pid", "tid", "tag"))
    counts = np.zeros(len(active) * len(rows), dtype=np.int64)
    counts[cov.get_column("qid").to_numpy()] = cov.get_column("count").to_numpy()
    # per set, which instances (rows of ``inst``) a scope of it encloses
    inside = {}
    for k, i in enumerate(active):
        inside[i] = np.zeros(n, dtype=bool)
        inside[i][rows] = counts[k * len(rows) : (k + 1) * len(rows)] > 0
    role = np.full(n, -1)
    for i in reversed(active):  # the first role of SCOPE_ROLES wins
        if i < len(SCOPE_ROLES):
            role[inside[i]] = i
    nothing = np.flatnonzero(~np.logical_or.reduce(list(inside.values())))
    none = np.zeros(n, dtype=bool)
    nxt, prv = len(SCOPE_ROLES), len(SCOPE_ROLES) + 1  # _DIRECTIONS: _next, then _prev
    return pl.DataFrame(
        [
            pl.Series("scope_role", [SCOPE_ROLES[r][0] if r >= 0 else None for r in role.tolist()], dtype=pl.Utf8),
            pl.Series("_next", inside.get(nxt, none)).scatter(nothing, None),
            pl.Series("_prev", inside.get(prv, none)).scatter(nothing, None),
        ]
    )


_ROW_SCHEMA = {
    "rank": pl.Int32, "event_id": pl.Int64, "name": pl.Utf8, "ts_ns": pl.Int64, "dur_ns": pl.Int64,
    "dtype": pl.Utf8,
    "pg_name": pl.Utf8, "pg_ranks": pl.Utf8, "peer": pl.Int32, "role": pl.Utf8, "iteration": pl.Int32,
    "stream": pl.Int32, "algbw_gbps": pl.Float64, "busbw_gbps": pl.Float64, "size_bytes": pl.Int64,
    "group_size": pl.Int32, "coll_seq": pl.Int64, "_inferred": pl.Utf8, "linked": pl.Boolean, "_order": pl.Int64,
}  # fmt: skip
"""Columns of a collective row before group keys and sequence numbers are added."""


_COLLECTIVES_SCHEMA = {
    **{c: t for c, t in _ROW_SCHEMA.items() if c != "_order"},
    "group_key": pl.Utf8,
    "end_ns": pl.Int64,
    "seq_in_group": pl.Int64,
}
"""Columns ``rank_collectives`` returns."""


def _empty_collectives() -> pl.DataFrame:
    """No collective rows, built without a query plan."""
    return pl.DataFrame(schema=_COLLECTIVES_SCHEMA)


_NAME_OF = {"k": "name", "a": "a_name", "r": "r_name", "n": "n_name", "c": "c_name"}
"""The operator name of each source of ``_first`` (its Input Dims follow that operator's signature)."""


def _first(row: dict, field: str, sources: str = "kra") -> object:
    """``field`` of the first of ``sources`` that has it: the instance's own args (``k``), its
    record_param_comms (``r``), NCCL range (``n``), annotation (``a``)."""
    return next((value for source in sources if (value := row[source + "_" + field]) is not None), None)


def rank_collectives(
    events: pl.DataFrame,
    operators: pl.DataFrame,
    *,
    layout: ParallelLayout,
    gpu_ranks: Collection[int],
    names: NameIndex | None = None,
) -> pl.DataFrame:
    """The collective instances of one or more ranks, before cross-rank matching.

    Args:
        events: the ranks' events with ``end_ns`` and ``uid``.
        operators: their operators with rank, uid, family, launch_ns, cpu_pid, cpu_tid, iteration,
            scope_name.
        layout: the run's parallel layout.
        gpu_ranks: ranks with GPU activity (instances are NCCL kernels); the others are CPU-only
            (instances are gloo work ranges).

    Returns:
        ``schema.COLLECTIVES`` columns except match_id/aligned_ts_ns, plus ``group_key`` (how
        instances of one group are recognised on every rank), ``coll_seq`` and ``end_ns``.
    """
    if names is not None and not (names.any_like(COMM_KERNEL) or names.any_like(CPU_WORK)):
        return _empty_collectives()  # no name of the batch can be an instance: no plan to run
    on_gpu = pl.col("rank").is_in(list(gpu_ranks))
    candidates = operators.lazy().filter(  # one plan
        (on_gpu & (pl.col("kind") == "kernel") & names_like(operators, COMM_KERNEL, names))
        | (~on_gpu & names_like(operators, CPU_WORK, names))
    )
    instances = candidates.select(
        "rank",
        on_gpu.alias("on_gpu"),
        "uid",
        "event_id",
        "name",
        "ts_ns",
        "dur_ns",
        "stream",
        "iteration",
        "launch_ns",
        "cpu_pid",
        "cpu_tid",
        "scope_name",
    )
    # the instances' own args: the few rows first (a join against all events hashes all events)
    own_args = events.lazy().join(candidates.select("uid"), on="uid", how="semi")
    own_args = own_args.select("uid", *[pl.col(c).alias("k_" + c) for c in _COLLECTIVE_ARGS])
    inst, own = pl.collect_all([instances, own_args], engine=ENGINE)
    if inst.height == 0:
        return _empty_collectives()
    gpu_rows = inst.get_column("on_gpu")
    if not gpu_rows.all():  # gloo work ranges (no filter plans when every instance is one)
        mixed = bool(gpu_rows.any())
        gpu_part, cpu_part = (inst.filter(on_gpu), inst.filter(~on_gpu)) if mixed else (inst.clear(), inst)
        inst = pl.concat([gpu_part, _link_cpu_work(events, cpu_part)], how="vertical_relaxed")
    context = _context_attrs(events, inst, names)
    scope = _scope_evidence(events, inst, names)
    nccl = nccl_api_fields(events, inst, names)
    own_of = {row[0]: dict(zip(own.columns[1:], row[1:], strict=True)) for row in own.iter_rows()}
    no_own = dict.fromkeys(own.columns[1:])
    # the rest per instance in Python: a plan joining and coalescing these tens of rows costs more
    records = []
    for r in inst.hstack(context).hstack(scope).hstack(nccl).iter_rows(named=True):
        r.update(own_of.get(r["uid"], no_own))
        if not r["on_gpu"]:
            # a gloo range is its own annotation: the one enclosing its call is another instance (an
            # async send still running when the next recv is called)
            r.update(dict.fromkeys(_tagged("a_")))
        r.update(
            _in=_first(r, "in_msg_nelems"),
            _out=_first(r, "out_msg_nelems"),
            _gsize=_first(r, "group_size", "krna"),
            pg_name=_first(r, "pg_name", "krna"),
            pg_ranks=_first(r, "pg_ranks"),
            coll_seq=_first(r, "coll_seq"),
            _cdtype=_first(r, "coll_dtype"),
            _cname=_first(r, "coll_name", "krna"),
            _src=_first(r, "src_rank", "krna"),
            _dst=_first(r, "dst_rank", "krna"),
            _dims=_first(r, "input_dims", "kar"),
            _dims_op=next((r[_NAME_OF[src]] for src in "kar" if r[src + "_input_dims"] is not None), None),
            _types=_first(r, "input_types", "kar"),
        )
        rank = r["rank"]
        # the instance's own name wins over its context's (a SendRecv kernel does not say)
        name = (
            normalize_collective(r["k_coll_name"])
            or normalize_collective(r["name"])
            or normalize_collective(r["_cname"])
            or normalize_collective(r["a_name"])
            or normalize_collective(r["c_name"])
            or "other"
        )
        ranks = parse_ranks(r["pg_ranks"])
        gsize = r["_gsize"] or (len(ranks) if ranks else None) or layout.world_size
        dtype = _coll_dtype(r["_cdtype"]) or _first_type(r["_types"])
        nbytes = DTYPE_BYTES.get(dtype) if dtype else None
        elems = max([x for x in (r["_in"], r["_out"]) if x is not None], default=None)
        size = elems * nbytes if elems is not None and nbytes else None
        if elems is None and r["n_bytes"] is not None:
            # NCCL's message size of an all-gather / reduce-scatter is one rank's shard
            scale = gsize if name in ("all_gather", "reduce_scatter") and gsize else 1
            size = r["n_bytes"] * scale
        elif elems is None:
            # the operator's own message (an all-gather's shard, or nothing where only a frame
            # around the call holds the tensor); nccl-tests S is an all-gather's total: the output
            # a call states (and its group, output / shard, when nothing records one), else
            # the shard times the group
            elems = message_elements(r["_dims_op"], r["_dims"], name)
            whole = (
                output_elements(r["c_name"], r["c_input_dims"]) or output_elements(r["_dims_op"], r["_dims"])
                if name == "all_gather"
                else None
            )
            if elems and whole and whole % elems == 0:
                if r["_gsize"] is None and not ranks:
                    gsize = whole // elems
                elems = whole
            elif elems is not None and name == "all_gather" and gsize:
                elems *= gsize
            size = elems * nbytes if elems is not None and nbytes else None
        role = role_of_group(ranks, layout) or r["scope_role"]
        if role is None and ranks is None and r["_gsize"] is None and layout.world_size:
            big = [a for a, s in (("tp", layout.tp), ("dp", layout.dp), ("pp", layout.pp)) if s and s > 1]
            role = big[0] if len(big) == 1 else None
        # no process group in the trace (gloo, older Kineto): the role's group under the layout
        # identifies the instance across ranks (kept out of pg_ranks: it is inferred, not recorded)
        inferred = layout_group(rank, role, layout) if ranks is None and role else None
        if inferred is not None:
            gsize = len(inferred)
        peer = None
        if name == "send" and r["_dst"] is not None:
            peer = r["_dst"]
        elif name == "recv" and r["_src"] is not None:
            peer = r["_src"]
        elif name in ("send", "recv") and ranks and len(ranks) == 2 and rank in ranks:
            peer = ranks[0] if ranks[1] == rank else ranks[1]
        elif name in ("send", "recv") and role == "pp" and inferred and (r["_next"] or r["_prev"]):
            stage = inferred.index(rank)
            step_ = 1 if r["_next"] else -1
            if 0 <= stage + step_ < len(inferred):
                peer = inferred[stage + step_]
        factor = busbw_factor(name, gsize)
        dur = r["dur_ns"]
        algbw = size / dur if size is not None and dur else None
        records.append(
            {
                "rank": rank,
                "event_id": r["event_id"],
                "name": name,
                "ts_ns": r["ts_ns"],
                "dur_ns": dur,
                "dtype": dtype,
                "pg_name": r["pg_name"],
                "pg_ranks": orjson.dumps(ranks).decode() if ranks else None,
                "peer": peer,
                "role": role or "unknown",
                "iteration": r["iteration"],
                "stream": r["stream"],
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * factor if algbw is not None and factor is not None else None,
                "size_bytes": size,
                "group_size": gsize,
                "coll_seq": r["coll_seq"],
                "_inferred": orjson.dumps(inferred).decode() if inferred else None,
                "linked": r["launch_ns"] is not None,
                # gloo work runs on several threads, so a range may start before one enqueued
                # earlier: the calls' order is the order every rank agrees on
                "_order": r["launch_ns"] if not r["on_gpu"] and r["launch_ns"] is not None else r["ts_ns"],
            }
        )
    # group key, end and order within the group in Python as well, for the same reason
    for rec in records:
        recorded = (rec["pg_name"], rec["pg_ranks"], rec["_inferred"])
        rec["group_key"] = next((key for key in recorded if key is not None), "default")
        rec["end_ns"] = rec["ts_ns"] + (rec["dur_ns"] or 0)
    # order within the group on this rank; instances launched before the capture (no CPU side)
    # are not numbered: another rank may not have recorded them at all
    ranks_linked = {rec["rank"] for rec in records if rec["linked"]}
    seen: dict[tuple[int, str, bool], int] = {}
    for rec in sorted(records, key=lambda rec: (rec["rank"], rec["_order"], rec["event_id"])):
        del rec["_order"]
        numbered = rec["linked"] or rec["rank"] not in ranks_linked
        group = (rec["rank"], rec["group_key"], rec["linked"])
        rec["seq_in_group"] = seen.get(group, 0) if numbered else None
        seen[group] = seen.get(group, 0) + 1
    records.sort(key=lambda rec: (rec["rank"], rec["ts_ns"], rec["event_id"]))
    return pl.DataFrame(records, schema=_COLLECTIVES_SCHEMA, orient="row")

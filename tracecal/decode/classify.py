"""Phase and component of every operator of one rank, pure (rules: docs/decode.md#phases, #components).

Phase evidence, strongest first, evaluated where the CPU launched the work (``launch_ns`` on the
launching thread):

1. autograd: the CPU operator, or a ``cpu_op`` enclosing the launch on the same thread, is a
   backward node (``*Backward*``, ``autograd::engine::evaluate_function``) or the operator carries a
   ``Fwd thread id`` -> ``bwd``;
2. an optimizer scope on any thread of the process (``Optimizer.step#...``, ``_exec_optimizer_step``,
   ``## optimizer ##``, ``zero_grad``) -> ``optimizer``;
3. a backward scope (``## backward ##``, ``_exec_backward_pass``, ``CheckpointFunctionBackward``)
   -> ``bwd``; a forward scope (``## forward ##``, ``_exec_forward_pass``, ``*.forward``) -> ``fwd``;
4. position in the iteration: before the iteration's first backward operator -> ``fwd``, up to its
   last backward operator -> ``bwd``, after it -> ``other``; an iteration with no backward evidence
   at all (inference, forward-only captures) is ``fwd``. Outside every iteration -> ``other``.

Components: comm operators -> ``comm_<role>`` (``comm_other`` when the role is unknown), memcpy and
memset -> ``memcpy``, otherwise by phase: ``compute_fwd``, ``compute_bwd``, ``optimizer``, ``other``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracecal.decode.frames import picked
from tracecal.decode.nesting import ENGINE, NameIndex, covered, names_like

AUTOGRAD = r"Backward\d*\b|Backward\d*$|autograd::engine::evaluate_function"
OPTIMIZER_SCOPE = (
    r"(?i)^Optimizer\.(step|zero_grad)|_exec_optimizer_step|##\s*(optimizer|zero_grad)\s*##|optimizer_step"
    r"|optimizer\.step|\bzero_grad\b"
)
BACKWARD_SCOPE = r"(?i)##\s*backward\s*##|_exec_backward_pass|CheckpointFunctionBackward|backward_step|\.backward\b"
FORWARD_SCOPE = r"(?i)##\s*forward\s*##|_exec_forward_pass|forward_step|\.forward\b|^nn\.Module:"
_SCOPE_KINDS = ("cpu_op", "user_annotation", "python_function", "nvtx")
NAME_PATTERNS = (AUTOGRAD, OPTIMIZER_SCOPE, BACKWARD_SCOPE, FORWARD_SCOPE)
"""The name regexes this module matches (``NameIndex`` matches them together)."""

COMPONENT_ORDER = (
    "compute_bwd",
    "compute_fwd",
    "optimizer",
    "comm_tp",
    "comm_pp",
    "comm_dp",
    "comm_ep",
    "comm_other",
    "memcpy",
    "other",
)
"""Components in priority order: when GPU activities of several components overlap, the instant is
attributed to the first (so exposed communication is what remains visible beside compute)."""


def _evidence(events: pl.DataFrame, pts: pl.DataFrame, names: NameIndex | None) -> pl.LazyFrame:
    """Per launch point, whether each kind of evidence covers it, in one sweep.

    Autograd nodes count on the launching thread only; framework scopes on any thread of the process
    (the backward pass runs on its own thread under a ``## backward ##`` scope of the main thread).
    Each evidence set is its own lane (``tag``), so one sort answers all four questions.
    """
    lev = events.lazy()  # lazy plans, one collect before and one after the sweep
    scope = pl.col("kind").is_in(_SCOPE_KINDS)  # one filter per set: a name mask has the events' rows
    sets = [
        ("_autograd", lev.filter((pl.col("kind") == "cpu_op") & names_like(events, AUTOGRAD, names)), True),
        ("_opt", lev.filter(scope & names_like(events, OPTIMIZER_SCOPE, names)), False),
        ("_bwd", lev.filter(scope & names_like(events, BACKWARD_SCOPE, names)), False),
        ("_fwd", lev.filter(scope & names_like(events, FORWARD_SCOPE, names)), False),
    ]
    patterns = (AUTOGRAD, OPTIMIZER_SCOPE, BACKWARD_SCOPE, FORWARD_SCOPE)
    # a set no name of the batch matches covers nothing: skip it (inference captures have no autograd)
    active = [i for i, p in enumerate(patterns) if names is None or names.any_like(p)]
    if not active:
        return pts.lazy().select(pl.col("qid").unique()).with_columns(pl.lit(False).alias(n) for n, _, _ in sets)
    iv_parts = []
    for i in active:  # lane ``tag``: the set's index (integers sort fast)
        _, frame, per_thread = sets[i]
        ivt = pl.col("tid") if per_thread else pl.lit(-1, dtype=pl.Int64)
        iv_parts.append(
            frame.select(
                "rank",
                "pid",
                ivt.cast(pl.Int64).alias("lane_tid"),
                pl.lit(i, dtype=pl.Int8).alias("tag"),
                pl.col("uid").alias("id"),
                "ts_ns",
                "end_ns",
            )
        )
    iv = pl.concat(iv_parts, how="vertical_relaxed").collect(engine=ENGINE)
    # the points once per active set, built from series (no plan): row k·n + j is point j asked
    # about set active[k]
    n, tid = pts.height, pts.get_column("tid").cast(pl.Int64)
    anywhere = pl.Series(np.full(n, -1, dtype=np.int64))
    allpts = pl.DataFrame(
        [
            *(pl.concat([pts.get_column(c)] * len(active)) for c in ("rank", "pid")),
            pl.concat([tid if sets[i][2] else anywhere for i in active]).alias("lane_tid"),
            pl.Series("tag", np.repeat(np.array(active, dtype=np.int8), n)),
            pl.Series("qid", np.arange(len(active) * n, dtype=np.int64)),
            pl.concat([pts.get_column("t")] * len(active)),
        ]
    )
    lane = ("rank", "pid", "lane_tid", "tag")
    cov = covered(iv, allpts, lane=lane)
    counts = np.zeros(allpts.height, dtype=np.int64)
    counts[cov.get_column("qid").to_numpy()] = cov.get_column("count").to_numpy()
    flags = {name: np.zeros(n, dtype=bool) for name, _, _ in sets}
    for k, i in enumerate(active):
        flags[sets[i][0]] = counts[k * n : (k + 1) * n] > 0
    return pl.DataFrame({"qid": pts.get_column("qid"), **flags}).lazy()


def phases_plan(events: pl.DataFrame, operators: pl.DataFrame, names: NameIndex | None = None) -> pl.LazyFrame:
    """``operators`` plus ``phase`` (fwd, bwd, optimizer, other) and ``phase_evidence``, as a lazy
    plan for the caller to finish in its own plan (one collect less).

    Args:
        events: the rank's events with ``end_ns``.
        operators: frame with rank, uid, cpu_pid, cpu_tid, launch_ns, cpu_op_name, cpu_fwd_thread_id,
            iteration (one or more ranks).
    """
    launched = operators.get_column("launch_ns").is_not_null()
    pts = picked(
        operators, {"rank": "rank", "cpu_pid": "pid", "cpu_tid": "tid", "uid": "qid", "launch_ns": "t"}, launched
    )
    out = operators.lazy().join(_evidence(events, pts, names).rename({"qid": "uid"}), on="uid", how="left")
    autograd = (
        pl.col("_autograd").fill_null(False)
        | (
            pl.col("cpu_op_name").fill_null("").str.contains(AUTOGRAD)
            if names is None
            else names.like(AUTOGRAD, "cpu_op_name").fill_null(False)  # CPU operators are events of the batch
        )
        | (pl.col("cpu_fwd_thread_id").fill_null(0) > 0)  # forward ops record 0
    )
    out = out.with_columns(
        pl.when(autograd)
        .then(pl.lit("autograd"))
        .when(pl.col("_opt").fill_null(False))
        .then(pl.lit("optimizer_scope"))
        .when(pl.col("_bwd").fill_null(False))
        .then(pl.lit("backward_scope"))
        .when(pl.col("_fwd").fill_null(False))
        .then(pl.lit("forward_scope"))
        .alias("phase_evidence")
    )
    out = out.with_columns(
        pl.col("phase_evidence")
        .replace_strict(
            {"autograd": "bwd", "optimizer_scope": "optimizer", "backward_scope": "bwd", "forward_scope": "fwd"},
            default=None,
            return_dtype=pl.Utf8,
        )
        .alias("phase")
    )
    # position in the iteration for operators without evidence
    # window expressions, not a group-by joined back: the self-join dominated this plan's cost (rows
    # outside every iteration form their own window, which ``positional`` never reads)
    when = pl.coalesce("launch_ns", "ts_ns")
    bwd_when = pl.when(pl.col("phase") == "bwd").then(when)
    out = out.with_columns(
        bwd_when.min().over("rank", "iteration").alias("_first_bwd"),
        bwd_when.max().over("rank", "iteration").alias("_last_bwd"),
    )
    positional = (
        pl.when(pl.col("iteration").is_null())
        .then(pl.lit("other"))
        .when(pl.col("_first_bwd").is_null() | (when < pl.col("_first_bwd")))
        .then(pl.lit("fwd"))
        .when(when <= pl.col("_last_bwd"))
        .then(pl.lit("bwd"))
        .otherwise(pl.lit("other"))
    )
    out = out.with_columns(
        pl.coalesce("phase", positional).alias("phase"),
        pl.col("phase_evidence").fill_null(pl.lit("position")),
    )
    return out.drop("_autograd", "_opt", "_bwd", "_fwd", "_first_bwd", "_last_bwd")


def _one_of(column: str, values: tuple[str, ...]) -> pl.Expr:
    """``pl.col(column).is_in(values)`` inside ``when`` as comparisons, which avoid the fixed per-plan
    cost of an ``is_in``."""
    return pl.any_horizontal(pl.col(column) == value for value in values)


def component_expr() -> pl.Expr:
    """Component (docs/decode.md#components) from ``family``, ``phase`` and the collective ``role`` columns."""
    return (
        pl.when(pl.col("family") == "comm")
        .then(
            pl.when(_one_of("role", ("tp", "dp", "pp", "ep")))
            .then(pl.lit("comm_") + pl.col("role"))
            .otherwise(pl.lit("comm_other"))
        )
        .when(_one_of("family", ("memcpy", "memset")))
        .then(pl.lit("memcpy"))
        .when(pl.col("phase") == "fwd")
        .then(pl.lit("compute_fwd"))
        .when(pl.col("phase") == "bwd")
        .then(pl.lit("compute_bwd"))
        .when(pl.col("phase") == "optimizer")
        .then(pl.lit("optimizer"))
        .otherwise(pl.lit("other"))
        .alias("component")
    )

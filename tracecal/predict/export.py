"""Chrome / Perfetto trace JSON of a run's timeline, measured and replayed (pure: frames in, bytes out).

A timeline is a frame of *spans* (``SPAN_COLUMNS``): stored ``events`` rows (``measured_spans``) or the
nodes of a replay graph at measured or replayed times (``graph_spans``). ``assign_tracks`` gives each
span its process and thread: one process per rank (``pid = rank + 1``; the predicted timeline of a
rank is ``PREDICTED_PID_OFFSET`` further) and one thread per CPU thread or GPU stream. Perfetto
nests the spans of a thread by time and moves a span that overlaps another without nesting to a
track of its own, so such spans are moved here, explicitly, to an *overlap* thread beside their own
(``(overlap k)`` in its name; a GPU span keeps its stream in ``args``). ``trace_json`` then writes
the document: complete (``X``) events, process/thread names, and one flow (``s``/``t``/``f``, bound to
the enclosing slice) per collective instance through its members in time order.

The measured timeline is a Kineto trace as ``trace-ingest`` reads it (``tracecal.sources.kineto.parser``):
the categories Kineto writes for each kind, ``ts``/``dur`` in µs with the nanoseconds as three
decimals (integers when whole), every stored argument under its Kineto key (JSON-valued ones such as
``Input Dims`` as JSON), ``device``/``stream`` on GPU activity, and ``distributedInfo`` at the top
level. Timestamps stay on each rank's own clock, so ingesting the export aligns the ranks again; a
replayed time is put on the same clock (``origin + replayed − clock offset``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import polars as pl

from tracecal.predict.components import node_components
from tracecal.predict.graph import ReplayGraph
from tracecal.vocabulary import DEVICE_TRACK_KINDS

PREDICTED_PID_OFFSET = 1_000_000
"""Added to a rank's process id for its predicted timeline (``--what both``)."""

SYNTHETIC_TID_BASE = 1 << 30
"""Threads numbered by the export (GPU streams, overlap lanes, ids that are not small positive
integers or repeat across a rank's processes) start here, above any Linux thread id."""

PREDICTED_FLOW_ID_OFFSET = 1 << 40
"""Flow ids of the predicted timeline: the collective's match_id plus this (measured: the match_id)."""

CATEGORY_BY_KIND = {
    "cpu_op": "cpu_op",
    "python_function": "python_function",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "sync": "cuda_sync",
    "trace": "Trace",
    "nvtx": "user_annotation",
}
"""``events.kind`` -> the category Kineto writes (read back as the same kind); others keep their own."""

INT_ARGS = {
    "external_id": "External id",
    "correlation": "correlation",
    "device": "device",
    "stream": "stream",
    "bytes": "bytes",
    "sequence_number": "Sequence number",
    "fwd_thread_id": "Fwd thread id",
    "in_msg_nelems": "In msg nelems",
    "out_msg_nelems": "Out msg nelems",
    "group_size": "Group size",
    "global_rank_start": "Global rank start",
    "global_rank_stride": "Global rank stride",
    "coll_seq": "Seq",
    "src_rank": "Src Rank",
    "dst_rank": "Dst Rank",
}
"""Integer ``events`` columns and the Kineto arg each is read from."""

TEXT_ARGS = {"coll_name": "Collective name", "coll_dtype": "dtype", "pg_name": "Process Group Name",
             "pg_desc": "Process Group Description"}  # fmt: skip
"""String ``events`` columns and their Kineto arg."""

JSON_ARGS = {
    "input_dims": "Input Dims",
    "input_types": "Input type",
    "concrete_inputs": "Concrete Inputs",
    "grid": "grid",
    "block": "block",
    "pg_ranks": "Process Group Ranks",
    "in_split_size": "In split size",
    "out_split_size": "Out split size",
}
"""``events`` columns holding JSON text, written as JSON values."""

ANNOTATION_ARGS = ("family", "phase", "component", "duration_source")
"""tracecal's own string args on operators (Kineto readers skip keys they do not know)."""

NS_ARGS = ("measured_dur_ns", "predicted_dur_ns")
"""tracecal's own duration args, integer ns."""

SPAN_COLUMNS = {
    "rank": pl.Int64,
    "predicted": pl.Boolean,
    "track": pl.String,
    "track_label": pl.String,
    "track_order": pl.Int64,
    "os_tid": pl.Int64,
    "name": pl.String,
    "cat": pl.String,
    "ts_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "event_id": pl.Int64,
    "match_id": pl.Int64,
    "collective": pl.String,
}
"""A span: its rank and timeline (``predicted``), its track (a key unique within the rank's process,
a label, an order: iteration, CPU threads, GPU streams, and the OS thread id to keep when it can),
name, category, start and duration (ns, the rank's clock; NULL duration when the trace has none), the
stored ``event_id`` (NULL for spans made by the export) and collective instance (``match_id`` and its
normalised name, NULL when not a matched member). Any other column is an argument (``*_ARGS``)."""


@dataclass(frozen=True)
class TrackReport:
    """What ``assign_tracks`` did: tracks written, and the spans moved to overlap tracks because they
    overlapped another span of their thread without nesting in it."""

    tracks: int
    moved_spans: int
    moved_tracks: int


# --- spans -----------------------------------------------------------------------------------------


def measured_spans(events: pl.DataFrame) -> pl.DataFrame:
    """Stored events (``events`` columns, plus optional ``family``/``phase``/``component``,
    ``predicted_dur_ns``, ``duration_source``, ``match_id``/``collective``) -> spans of the measured
    timeline. GPU activity goes on its device's stream track, everything else on its (pid, tid)
    thread; an event with no thread (Kineto's own profiler span) on a ``profiler`` track."""
    is_gpu = pl.col("kind").is_in(list(DEVICE_TRACK_KINDS))
    no_tid = pl.col("tid").is_null()
    cpu_key = pl.format("cpu:{}:{}", pl.col("pid").fill_null(-1), pl.col("tid"))
    gpu_key = pl.format("gpu:{}:{}", pl.col("device").fill_null(-1), pl.col("stream").fill_null(-1))
    frame = events.with_columns(
        pl.lit(False).alias("predicted"),
        pl.when(is_gpu).then(gpu_key).when(no_tid).then(pl.lit("profiler")).otherwise(cpu_key).alias("track"),
        pl.when(is_gpu)
        .then(pl.format("stream {}", pl.col("stream").fill_null(-1)))
        .when(no_tid)
        .then(pl.lit("profiler"))
        .otherwise(pl.format("thread {}", pl.col("tid")))
        .alias("track_label"),
        pl.when(is_gpu).then(2).when(no_tid).then(3).otherwise(1).cast(pl.Int64).alias("track_order"),
        pl.when(is_gpu).then(None).otherwise(pl.col("tid")).cast(pl.Int64).alias("os_tid"),
        pl.col("kind").replace_strict(CATEGORY_BY_KIND, default=pl.col("category")).alias("cat"),
        pl.when(is_gpu).then(pl.col("device")).otherwise(None).alias("device"),
        pl.when(is_gpu).then(pl.col("stream")).otherwise(None).alias("stream"),
    )
    if "family" in events.columns:  # operators only carry a measured duration worth comparing
        frame = frame.with_columns(
            pl.when(pl.col("family").is_not_null()).then(pl.col("dur_ns")).alias("measured_dur_ns")
        )
    return _complete(frame)


def graph_spans(
    graph: ReplayGraph,
    times: np.ndarray,
    *,
    offsets: Mapping[int, int],
    predicted: bool,
    annotations: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """The operators and runtime calls of a replay graph at ``times`` (a replay's point times, start
    ``2·node``, end ``2·node + 1``, relative to ``graph.origin_ns``) as spans on their rank's clock,
    plus one ``iteration`` span per rank on an ``iteration`` track over the nodes that bound it.

    Args:
        graph: the replay graph.
        times: ``graph.measured_times`` or a replay's result.
        offsets: rank -> clock offset (ns) the graph added to align the rank.
        predicted: the spans belong to the predicted timeline (else the measured one).
        annotations: per node (``node`` column): extra args (``phase``, ``measured_dur_ns``,
            ``predicted_dur_ns``, ``duration_source``).
    """
    nodes = graph.nodes
    frame = nodes.select(
        "node", "rank", "event_id", "name", "kind", "node_kind", "lane_stream", "lane_tid", "family",
        "match_id", "in_span",
    ).with_columns(
        pl.Series("component", node_components(graph), dtype=pl.String),
        pl.Series("_start", times[0::2]),
        pl.Series("_end", times[1::2]),
    )  # fmt: skip
    if "collective" in graph.features.columns:
        collectives = graph.features.select("node", "collective").filter(pl.col("collective").is_not_null())
        frame = frame.join(collectives, on="node", how="left", maintain_order="left")
    offset = pl.col("rank").replace_strict(list(offsets), list(offsets.values()), default=0, return_dtype=pl.Int64)
    frame = frame.with_columns(
        (pl.col("_start") + graph.origin_ns - offset).alias("ts_ns"),
        (pl.col("_end") - pl.col("_start")).alias("dur_ns"),
    )
    iteration = (
        frame.filter(pl.col("in_span"))
        .group_by("rank")
        .agg(pl.col("ts_ns").min(), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("_stop"))
        .select(
            "rank",
            "ts_ns",
            (pl.col("_stop") - pl.col("ts_ns")).alias("dur_ns"),
            pl.lit("iteration").alias("track"),
            pl.lit("iteration").alias("track_label"),
            pl.lit(0, pl.Int64).alias("track_order"),
            pl.lit("iteration").alias("name"),
            pl.lit("user_annotation").alias("cat"),
        )
    )
    ops = frame.filter(pl.col("node_kind").is_in(["activity", "runtime"]))
    is_gpu = pl.col("lane_stream").is_not_null()
    is_op = pl.col("node_kind") == "activity"
    ops = ops.with_columns(
        pl.when(is_gpu)
        .then(pl.format("gpu:{}", "lane_stream"))
        .otherwise(pl.format("cpu:{}", "lane_tid"))
        .alias("track"),
        pl.when(is_gpu)
        .then(pl.format("stream {}", "lane_stream"))
        .otherwise(pl.format("thread {}", "lane_tid"))
        .alias("track_label"),
        pl.when(is_gpu).then(2).otherwise(1).cast(pl.Int64).alias("track_order"),
        pl.col("lane_tid").alias("os_tid"),
        pl.when(is_op)
        .then(pl.col("kind").replace_strict(CATEGORY_BY_KIND, default=pl.col("kind")))
        .otherwise(pl.lit("cuda_runtime"))
        .alias("cat"),
        pl.when(is_op).then(pl.col("family")).alias("family"),
        pl.when(is_op).then(pl.col("component")).alias("component"),
        pl.when(pl.col("match_id").is_not_null()).then(pl.col("collective") if "collective" in frame.columns else None)
        .alias("collective"),
    )  # fmt: skip
    if annotations is not None and annotations.height:
        ops = ops.join(annotations, on="node", how="left", maintain_order="left")
    parts = [_complete(f.with_columns(pl.lit(predicted).alias("predicted"))) for f in (ops, iteration)]
    return pl.concat(parts, how="diagonal_relaxed")


def _complete(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with every span column (NULL where missing) in its type; argument columns kept."""
    present = {c: t for c, t in SPAN_COLUMNS.items() if c in frame.columns}
    frame = frame.with_columns(pl.col(c).cast(t) for c, t in present.items())
    missing = [pl.lit(None, t).alias(c) for c, t in SPAN_COLUMNS.items() if c not in frame.columns]
    args = [c for c in (*INT_ARGS, *TEXT_ARGS, *JSON_ARGS, *ANNOTATION_ARGS, *NS_ARGS) if c in frame.columns]
    return frame.with_columns(missing).select(*SPAN_COLUMNS, *args)


# --- tracks ----------------------------------------------------------------------------------------


def nesting_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane of each span of one thread (spans sorted by start, then longest first) so that the spans
    of every lane nest or follow each other: lane 0 unless the span overlaps an open span of the lane
    without ending inside it, then the first lane where it fits."""
    lanes = np.zeros(starts.size, dtype=np.int64)
    if _nests(starts, ends):
        return lanes
    stacks: list[list[int]] = [[]]
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lanes[i] = k
                break
        else:
            stacks.append([e])
            lanes[i] = len(stacks) - 1
    return lanes


def _nests(starts: np.ndarray, ends: np.ndarray) -> bool:
    """Whether every span of one thread (sorted as for ``nesting_lanes``) nests in or follows the others,
    so that all of them are on lane 0, checked without a walk through the spans.

    The opens and closes of the spans that last (an empty span never overlaps) are read as brackets in
    time order, a close before an open at the same instant and the inner span's close first: they nest
    iff each span's close finds the depth its open left, which two binary searches give for all spans."""
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    n = s.size
    reversed_order = np.argsort(e[::-1], kind="stable")  # by end, the later-opened span first on a tie
    close_rank = np.empty(n, dtype=np.int64)
    close_rank[n - 1 - reversed_order] = np.arange(n)
    sorted_ends = e[::-1][reversed_order]
    depth_at_open = np.arange(1, n + 1) - np.searchsorted(sorted_ends, s, side="right")
    depth_at_close = np.searchsorted(s, e, side="left") - close_rank
    return bool(np.array_equal(depth_at_open, depth_at_close))


def _thread_bounds(thread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and past-the-end row of each run of equal values in ``thread`` (sorted)."""
    cuts = np.flatnonzero(thread[1:] != thread[:-1]) + 1
    return np.concatenate([[0], cuts]), np.concatenate([cuts, [thread.size]])


def _lanes(thread: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``nesting_lanes`` of every thread of spans sorted by thread, start, longest first."""
    lane = np.zeros(thread.size, dtype=np.int64)
    for a, b in zip(*_thread_bounds(thread), strict=True):
        lane[a:b] = nesting_lanes(starts[a:b], ends[a:b])
    return lane


def assign_tracks(spans: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, TrackReport]:
    """Process and thread ids of every span, spans that break their thread's nesting on overlap lanes.

    Returns:
        The spans (less their track columns) with ``pid``, ``tid`` (each thread's spans by start,
        longest first), the threads (pid, tid, label, sort index), and a ``TrackReport``.
    """
    key = ["rank", "predicted", "track"]
    # one integer per (rank, timeline, track), so that millions of spans are grouped and sorted on it
    # rather than on the track's text; numbered below in the order of the text
    code = pl.col("track").cast(pl.Categorical).to_physical().cast(pl.Int64).fill_null(-1) + 1
    spans = spans.with_columns(
        ((pl.col("rank") * 2 + pl.col("predicted").cast(pl.Int64)) * (1 << 32) + code).alias("_key"),
        (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(lower_bound=0)).alias("_end"),
    )
    firsts = spans.select(pl.col("_key").arg_unique())
    threads = (
        spans[firsts.to_series()]
        .select("_key", *key)
        .sort("rank", "predicted", pl.col("track").cast(pl.String), maintain_order=True)
    )
    # the order is found on the keys alone, and only the columns a trace is written from move with it
    order = spans.select(
        pl.col("_key").replace_strict(threads["_key"], np.arange(threads.height), return_dtype=pl.Int64).alias("_t"),
        "ts_ns",
        "_end",
        pl.int_range(pl.len()).alias("_row"),
    ).sort("_t", "ts_ns", "_end", descending=[False, False, True], maintain_order=True)
    thread = order["_t"].to_numpy()
    rows = order["_row"].to_numpy()
    lane = _lanes(thread, order["ts_ns"].to_numpy(), order["_end"].to_numpy())
    # each (thread, lane) is one track, named after its first span
    width = int(lane.max()) + 1 if lane.size else 1
    first = np.unique(thread * width + lane, return_index=True)[1] if width > 1 else _thread_bounds(thread)[0]
    tracks = (
        spans[rows[first]]
        .select(
            *key, "track_label", "track_order", "os_tid", pl.Series("lane", lane[first]), pl.Series("_t", thread[first])
        )
        .with_columns(pl.col("track", "track_label").cast(pl.String))
        .sort("rank", "predicted", "track_order", "track", "lane")
    )
    # the OS thread id stays the tid where it is a plain small id of one thread of the rank
    own = (
        (pl.col("lane") == 0)
        & pl.col("os_tid").is_between(1, SYNTHETIC_TID_BASE - 1)
        & ((pl.col("lane") == 0).sum().over("rank", "predicted", "os_tid") == 1)
    )
    tracks = tracks.with_columns(
        (pl.col("rank") + 1 + pl.when(pl.col("predicted")).then(PREDICTED_PID_OFFSET).otherwise(0)).alias("pid"),
        pl.when(own)
        .then(pl.col("os_tid"))
        .otherwise(SYNTHETIC_TID_BASE + pl.int_range(pl.len()).over("rank", "predicted"))
        .alias("tid"),
        pl.when(pl.col("lane") > 0)
        .then(pl.format("{} (overlap {})", "track_label", "lane"))
        .otherwise(pl.col("track_label"))
        .alias("label"),
        pl.int_range(pl.len()).over("rank", "predicted").alias("sort_index"),
    )
    by_code = tracks.select((pl.col("_t") * width + pl.col("lane")).alias("code"), "pid", "tid").sort("code")
    # every thread has a lane-0 track, so with one lane the codes are 0, 1, ... and a span's code is its row
    row = thread if width == 1 else np.searchsorted(by_code["code"].to_numpy(), thread * width + lane)
    track_columns = ["track", "track_label", "track_order", "os_tid", "_key", "_end"]
    spans = spans.drop(track_columns)[rows].with_columns(
        pl.Series("pid", by_code["pid"].to_numpy()[row]), pl.Series("tid", by_code["tid"].to_numpy()[row])
    )
    moved = lane > 0
    report = TrackReport(
        tracks=tracks.height, moved_spans=int(moved.sum()), moved_tracks=int(np.unique(thread[moved]).size)
    )
    # no second sort: each thread's spans are already in start order, longest first, which is all a reader needs
    return spans, tracks.select("rank", "predicted", "pid", "tid", "label", "sort_index"), report


def check_nesting(spans: pl.DataFrame) -> int:
    """Spans (``pid``, ``tid``, ``ts_ns``, ``dur_ns``) that overlap another span of their thread
    without nesting in it: 0 for a trace Perfetto shows on the threads it names."""
    frame = spans.select(
        "pid", "tid", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(lower_bound=0)).alias("_end")
    ).sort("pid", "tid", "ts_ns", "_end", descending=[False, False, False, True], maintain_order=True)
    new_thread = frame.select((pl.col("pid").diff() != 0) | (pl.col("tid").diff() != 0)).to_series()
    thread = new_thread.fill_null(False).cum_sum().to_numpy()
    lane = _lanes(thread, frame["ts_ns"].to_numpy(), frame["_end"].to_numpy())
    return int((lane > 0).sum())


# --- JSON ------------------------------------------------------------------------------------------


def _quoted(series: pl.Series) -> pl.Series:
    """Each string as a JSON string literal (escaped by orjson once per distinct value); NULL stays."""
    distinct = series.drop_nulls().unique()
    literals = [orjson.dumps(v).decode() for v in distinct.to_list()]
    return series.replace_strict(distinct, literals, default=None, return_dtype=pl.String)


_FRACTIONS = pl.Series([""] + [f".{ns:03d}" for ns in range(1, 1000)])
"""The µs fraction text of each ns remainder (none for whole µs)."""

LINE_SEPARATOR = ",\n"
"""Between two events of ``traceEvents``."""


def _microseconds(column: str) -> pl.Expr:
    """Integer ns as the exact decimal µs text: ``1500`` -> ``1.5`` written ``1.500``, whole µs as integers."""
    ns = pl.col(column)
    magnitude = ns.abs()
    return pl.concat_str(
        pl.when(ns < 0).then(pl.lit("-")),
        (magnitude // 1000).cast(pl.String),
        pl.lit(_FRACTIONS).gather(magnitude % 1000),
        ignore_nulls=True,
    )


def _separators(first: bool) -> pl.Expr:
    """The text before each line: ``LINE_SEPARATOR``, except before the document's first event."""
    if first:
        return pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("")).otherwise(pl.lit(LINE_SEPARATOR))
    return pl.lit(LINE_SEPARATOR)


def event_lines(spans: pl.DataFrame, *, first: bool = True) -> pl.Series:
    """One JSON object per span (``ph`` X), from spans with ``pid``/``tid``, each after its separator
    (``first``: none before the first line): the lines written one after another continue the array."""
    frame = spans.with_columns(
        *(pl.Series(c, _quoted(spans[c])) for c in ("name", "cat", *TEXT_ARGS, *ANNOTATION_ARGS) if c in spans.columns)
    )
    args = []
    for column, key in INT_ARGS.items():
        if column in frame.columns:
            args.append(pl.format('"{}":{}', pl.lit(key), pl.col(column)))
    for column, key in (*TEXT_ARGS.items(), *JSON_ARGS.items(), *((c, c) for c in (*ANNOTATION_ARGS, *NS_ARGS))):
        if column in frame.columns:
            args.append(pl.format('"{}":{}', pl.lit(key), pl.col(column)))
    body = pl.concat_str(args, separator=",", ignore_nulls=True) if args else pl.lit("")
    dur = pl.when(pl.col("dur_ns").is_not_null()).then(pl.concat_str(pl.lit(',"dur":'), _microseconds("dur_ns")))
    line = pl.concat_str(
        _separators(first),
        pl.lit('{"ph":"X","cat":'),
        pl.col("cat").fill_null('"other"'),
        pl.lit(',"name":'),
        pl.col("name"),
        pl.lit(',"pid":'),
        pl.col("pid").cast(pl.String),
        pl.lit(',"tid":'),
        pl.col("tid").cast(pl.String),
        pl.lit(',"ts":'),
        _microseconds("ts_ns"),
        dur.otherwise(pl.lit("")),
        pl.lit(',"args":{'),
        body.fill_null(""),
        pl.lit("}}"),
    )
    return frame.select(line.alias("line"))["line"]


def flow_lines(spans: pl.DataFrame, *, first: bool = True) -> pl.Series:
    """One flow per collective instance with at least two members among ``spans``: start (``s``) at
    the member whose middle comes first, steps (``t``), finish (``f``), each at its member's middle
    on its thread and bound to that slice (``bp: e``); separated as ``event_lines``."""
    members = spans.filter(pl.col("match_id").is_not_null()).select(
        "pid", "tid", "predicted", "match_id", "collective",
        (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(lower_bound=0) // 2).alias("mid_ns"),
    )  # fmt: skip
    members = members.with_columns(pl.len().over("predicted", "match_id").alias("_n")).filter(pl.col("_n") > 1)
    if members.height == 0:
        return pl.Series("line", [], pl.String)
    members = members.sort("predicted", "match_id", "mid_ns", "pid").with_columns(
        pl.int_range(pl.len()).over("predicted", "match_id").alias("_k"),
        pl.Series("collective", _quoted(members["collective"].fill_null("collective"))),
    )
    phase = pl.when(pl.col("_k") == 0).then(pl.lit("s")).when(pl.col("_k") == pl.col("_n") - 1).then(pl.lit("f"))
    flow_id = pl.col("match_id") + pl.when(pl.col("predicted")).then(PREDICTED_FLOW_ID_OFFSET).otherwise(0)
    line = pl.concat_str(
        _separators(first),
        pl.lit('{"ph":"'),
        phase.otherwise(pl.lit("t")),
        pl.lit('","cat":"collective","name":'),
        pl.col("collective"),
        pl.lit(',"id":'),
        flow_id.cast(pl.String),
        pl.lit(',"pid":'),
        pl.col("pid").cast(pl.String),
        pl.lit(',"tid":'),
        pl.col("tid").cast(pl.String),
        pl.lit(',"ts":'),
        _microseconds("mid_ns"),
        pl.lit(',"bp":"e"}'),
    )
    return members.select(line.alias("line"))["line"]


def metadata_lines(tracks: pl.DataFrame) -> list[str]:
    """Process and thread names and sort indices (``ph`` M) of the tracks."""
    lines = []
    for (rank, predicted, pid), group in tracks.group_by(["rank", "predicted", "pid"], maintain_order=True):
        name = f"rank {rank} (predicted)" if predicted else f"rank {rank}"
        lines.append(_meta("process_name", pid, None, {"name": name}))
        lines.append(_meta("process_sort_index", pid, None, {"sort_index": int(pid)}))
        for tid, label, index in group.select("tid", "label", "sort_index").iter_rows():
            lines.append(_meta("thread_name", pid, tid, {"name": label}))
            lines.append(_meta("thread_sort_index", pid, tid, {"sort_index": index}))
    return lines


def _meta(name: str, pid: Any, tid: Any, args: dict[str, Any]) -> str:
    event = {"ph": "M", "name": name, "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return orjson.dumps(event).decode()


def trace_json(
    spans: pl.DataFrame, tracks: pl.DataFrame, header: Mapping[str, Any], *, flows: bool = True, chunk: int = 500_000
) -> Iterator[bytes | pl.Series]:
    """The trace document in pieces, to be written one after another: ``header`` keys
    (``distributedInfo`` ...), then ``traceEvents``: metadata, complete events (``chunk`` at a time,
    so a large trace is never one string), flows. A piece is bytes or a Series of lines (text that
    ``write_lines`` writes without building one string of them)."""
    head = orjson.dumps(dict(header))
    yield head[:-1] + (b',"traceEvents":[\n' if len(head) > 2 else b'"traceEvents":[\n')
    first = True
    meta = metadata_lines(tracks)
    if meta:
        yield LINE_SEPARATOR.join(meta).encode()
        first = False
    for i in range(0, spans.height, chunk):
        yield event_lines(spans.slice(i, chunk), first=first)
        first = False
    if flows:
        lines = flow_lines(spans, first=first)
        if lines.len():
            yield lines
    yield b"\n]}\n"


def write_lines(sink: Any, lines: pl.Series) -> None:
    """Write each line of ``lines`` as it is (no quoting, nothing between lines; NULL writes nothing)."""
    lines.to_frame().write_csv(sink, include_header=False, quote_style="never", line_terminator="")

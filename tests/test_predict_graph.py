"""Dependency graph and replay on tiny hand-built iterations whose answers can be checked by hand."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracecal.errors import PredictionError
from tracecal.predict.edges import EDGE_KINDS, chain_predecessors
from tracecal.predict.graph import ReplayInputs, build_graph, topological_schedule
from tracecal.predict.replay import edge_lags, replay

ACT_COLUMNS = ("rank", "event_id", "kind", "name", "ts_ns", "dur_ns", "stream", "cpu_tid", "runtime_event_id")
ACT_COLUMNS += ("family", "component")
RUNTIME_SCHEMA = {
    "rank": pl.Int64,
    "event_id": pl.Int64,
    "name": pl.String,
    "ts_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "tid": pl.Int64,
}


def _ranks(n: int, end: int, offsets: list[int] | None = None) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "rank": list(range(n)),
            "clock_offset_ns": offsets or [0] * n,
            "window_start_ns": [0] * n,
            "window_end_ns": [end] * n,
            "main_tid": [1] * n,
        }
    )


def gpu_two_ranks(offsets: list[int] | None = None) -> ReplayInputs:
    """Two GPU ranks: a GEMM then an all-reduce kernel on stream 7, then a device synchronize.

    rank 0: launch [0,10] -> gemm [15,100]; launch [20,30] -> nccl [100,150]; sync [40,200]
    rank 1: launch [0,10] -> gemm [15,45];  launch [20,30] -> nccl [50,150];  sync [40,152]
    """
    acts = pl.DataFrame(
        {
            "rank": [0, 0, 1, 1],
            "event_id": [10, 11, 10, 11],
            "kind": ["kernel"] * 4,
            "name": ["gemm", "nccl", "gemm", "nccl"],
            "ts_ns": [15, 100, 15, 50],
            "dur_ns": [85, 50, 30, 100],
            "stream": [7, 7, 7, 7],
            "cpu_tid": [1, 1, 1, 1],
            "runtime_event_id": [1, 2, 1, 2],
            "family": ["gemm", "comm", "gemm", "comm"],
            "component": ["compute_fwd", "comm_dp", "compute_fwd", "comm_dp"],
        }
    )
    if offsets:  # the same schedule seen through skewed clocks
        acts = acts.with_columns(pl.col("ts_ns") - pl.col("rank").replace_strict({0: offsets[0], 1: offsets[1]}))
    coll = pl.DataFrame(
        {"rank": [0, 1], "event_id": [11, 11], "match_id": [1, 1], "name": ["all_reduce"] * 2, "role": ["dp"] * 2}
    )
    rt = pl.DataFrame(
        {
            "rank": [0, 0, 0, 1, 1, 1],
            "event_id": [1, 2, 3, 1, 2, 3],
            "name": ["cudaLaunchKernel"] * 2
            + ["cudaDeviceSynchronize"]
            + ["cudaLaunchKernel"] * 2
            + ["cudaDeviceSynchronize"],
            "ts_ns": [0, 20, 40, 0, 20, 40],
            "dur_ns": [10, 10, 160, 10, 10, 112],
            "tid": [1] * 6,
        },
        schema=RUNTIME_SCHEMA,
    )
    if offsets:
        rt = rt.with_columns(pl.col("ts_ns") - pl.col("rank").replace_strict({0: offsets[0], 1: offsets[1]}))
    return ReplayInputs(acts, coll, rt, _ranks(2, 200, offsets))


def cpu_pipeline() -> ReplayInputs:
    """Two CPU-only (gloo) pipeline stages; comm ops are asynchronous spans on the main thread.

    rank 0: A [10,110]; c10d::send [120,130]; gloo:send→1 [125,300]; B [140,240]; gloo:recv←1 [250,700]; C [710,900]
    rank 1: gloo:recv←0 [5,305]; D [310,500]; gloo:send→0 [505,700]; E [705,950]; both iterations end at 1000.
    """
    rows = [
        (0, 1, "A", 10, 100, "gemm"),
        (0, 2, "c10d::send", 120, 10, "comm"),
        (0, 3, "gloo:send", 125, 175, "comm"),
        (0, 4, "B", 140, 100, "gemm"),
        (0, 5, "gloo:recv", 250, 450, "comm"),
        (0, 6, "C", 710, 190, "gemm"),
        (1, 1, "gloo:recv", 5, 300, "comm"),
        (1, 2, "D", 310, 190, "gemm"),
        (1, 3, "gloo:send", 505, 195, "comm"),
        (1, 4, "E", 705, 245, "gemm"),
    ]
    acts = pl.DataFrame(rows, schema=["rank", "event_id", "name", "ts_ns", "dur_ns", "family"], orient="row")
    acts = acts.with_columns(
        pl.lit("cpu_op").alias("kind"),
        pl.lit(None, pl.Int64).alias("stream"),
        pl.lit(1).alias("cpu_tid"),
        pl.lit(None, pl.Int64).alias("runtime_event_id"),
        pl.when(pl.col("family") == "comm")
        .then(pl.lit("comm_other"))
        .otherwise(pl.lit("compute_fwd"))
        .alias("component"),
    )
    coll = pl.DataFrame(
        {
            "rank": [0, 1, 1, 0],
            "event_id": [3, 1, 3, 5],
            "match_id": [1, 1, 2, 2],
            "name": ["send", "recv", "send", "recv"],
            "role": ["pp"] * 4,
        }
    )
    return ReplayInputs(acts, coll, pl.DataFrame(schema=RUNTIME_SCHEMA), _ranks(2, 1000))


def _node(graph, rank: int, name: str) -> int:
    row = graph.nodes.filter((pl.col("rank") == rank) & (pl.col("name") == name))
    assert row.height == 1, (rank, name)
    return int(row["node"][0])


def _with_duration(graph, rank: int, name: str, dur: int) -> np.ndarray:
    durations = graph.nodes["dur_ns"].to_numpy().copy()
    durations[_node(graph, rank, name)] = dur
    return durations


def test_gpu_measured_replay_reproduces_every_point():
    g = build_graph(gpu_two_ranks())
    assert np.array_equal(replay(g), g.measured_times)
    counts = g.edge_counts()
    assert counts["launch"] == 4 and counts["stream"] == 2 and counts["sync"] == 2
    assert counts["coll_join"] == 2 and counts["coll_end"] == 2


def test_gpu_shorter_gemm_moves_the_collective_and_the_synchronize():
    g = build_graph(gpu_two_ranks())
    t = replay(g, _with_duration(g, 0, "gemm", 40)).reshape(-1, 2)
    # rank 0's all-reduce kernel now starts when its gemm ends (55); the instance starts when the
    # last member is ready (55, rank 1 was ready at 50) and lasts its transfer time 150-100 = 50
    assert t[_node(g, 0, "nccl")].tolist() == [55, 105]
    assert t[_node(g, 1, "nccl")].tolist() == [50, 105]  # rank 1 still starts at 50, ends together
    sync0 = g.nodes.filter((pl.col("rank") == 0) & (pl.col("name") == "cudaDeviceSynchronize"))["node"][0]
    assert t[sync0, 1] == 105 + 50  # the synchronize returns 50 ns after the kernel, as measured


def test_gpu_launch_bound_kernel_follows_its_launch():
    g = build_graph(gpu_two_ranks())
    # rank 1's gemm was launch-bound (stream idle): a longer gemm delays the collective for everyone
    t = replay(g, _with_duration(g, 1, "gemm", 200)).reshape(-1, 2)
    assert t[_node(g, 1, "gemm")].tolist() == [15, 215]
    # the measured 5 ns between the gemm's end and the kernel's start is kept (unexplained delay)
    assert t[_node(g, 1, "nccl")][0] == 220
    assert t[_node(g, 0, "nccl")][1] == 220 + 50


def test_clock_offsets_align_ranks():
    skewed = build_graph(gpu_two_ranks(offsets=[0, 1000]))
    plain = build_graph(gpu_two_ranks())
    # identical aligned schedule, so identical replays (relative to the graph origin)
    a = replay(skewed, _with_duration(skewed, 0, "gemm", 40))
    b = replay(plain, _with_duration(plain, 0, "gemm", 40))
    assert np.array_equal(a, b)


def test_cpu_pipeline_edges_and_measured_replay():
    g = build_graph(cpu_pipeline())
    assert np.array_equal(replay(g), g.measured_times)
    kinds = [EDGE_KINDS[k] for k in g.edge_kind]
    pairs = {(EDGE_KINDS[k], int(s) // 2, int(d) // 2) for s, d, k in zip(g.src, g.dst, g.edge_kind, strict=True)}
    # D waited for the activations (the recv ended at 305, D began at 310 after an idle gap)
    assert ("wait", _node(g, 1, "gloo:recv"), _node(g, 1, "D")) in pairs
    # B overlapped the send: no wait; C waited for the gradients
    assert ("wait", _node(g, 0, "gloo:send"), _node(g, 0, "B")) not in pairs
    assert ("wait", _node(g, 0, "gloo:recv"), _node(g, 0, "C")) in pairs
    # gloo:send was enqueued from inside c10d::send
    assert ("issue", _node(g, 0, "c10d::send"), _node(g, 0, "gloo:send")) in pairs
    assert kinds.count("coll_join") == 4


def test_cpu_pipeline_faster_stage_shortens_both_ranks():
    g = build_graph(cpu_pipeline())
    t = replay(g, _with_duration(g, 1, "D", 100)).reshape(-1, 2)
    assert t[_node(g, 1, "gloo:send")][0] == 415  # D ends at 410, send issued 5 ns later
    assert t[_node(g, 0, "gloo:recv")][1] == 610  # transfer 700 - 505 = 195 after the last member
    assert t[_node(g, 0, "C")].tolist() == [620, 810]
    ends = g.nodes.filter(pl.col("name") == "iteration_end")["node"].to_list()
    assert [t[n, 0] for n in ends] == [910, 910]  # both iterations end 90 ns earlier


def test_chain_predecessors_follow_the_latest_end():
    group = np.array([0, 0, 0, 0, 1, 1])
    start = np.array([0, 1, 5, 30, 0, 10])
    end = np.array([20, 4, 25, 40, 5, 12])
    # row 2 starts inside row 0 (nested): its predecessor is still row 0; row 3 follows row 2 (ends last)
    assert chain_predecessors(group, start, end).tolist() == [-1, 0, 0, 2, -1, 4]


def test_cycle_is_reported():
    with pytest.raises(PredictionError, match="cycle"):
        topological_schedule(3, np.array([0, 1, 2]), np.array([1, 2, 1]))


def test_no_operators_is_a_clear_error():
    empty = cpu_pipeline()
    with pytest.raises(PredictionError, match="no operators"):
        build_graph(ReplayInputs(empty.activities.head(0), empty.collectives, empty.runtime, empty.ranks))


@st.composite
def random_gpu_iteration(draw):
    """Random multi-rank GPU iterations: launches with gaps, kernels on two streams, collectives."""
    n_ranks = draw(st.integers(1, 3))
    n_ops = draw(st.integers(1, 12))
    acts, rts, colls = [], [], []
    for r in range(n_ranks):
        t_cpu = draw(st.integers(0, 50))
        stream_end = {7: 0, 9: 0}
        for i in range(n_ops):
            t_cpu += draw(st.integers(0, 30))
            rt_dur = draw(st.integers(1, 10))
            rts.append((r, 1000 + i, "cudaLaunchKernel", t_cpu, rt_dur, 1))
            stream = 9 if i % 4 == 3 else 7
            start = max(t_cpu + draw(st.integers(0, 8)), stream_end[stream] + draw(st.integers(0, 3)))
            dur = draw(st.integers(0, 60))
            stream_end[stream] = start + dur
            acts.append((r, i, "kernel", f"k{i}", start, dur, stream, 1, 1000 + i, "gemm", "compute_fwd"))
            if stream == 9:
                colls.append((r, i, i, "all_reduce", "dp"))
            t_cpu += rt_dur
    a = pl.DataFrame(
        acts,
        schema=[*ACT_COLUMNS],
        orient="row",
    )
    c = pl.DataFrame(colls, schema=["rank", "event_id", "match_id", "name", "role"], orient="row")
    rt = pl.DataFrame(rts, schema=list(RUNTIME_SCHEMA), orient="row")
    return ReplayInputs(a, c, rt, _ranks(n_ranks, 10_000))


@settings(max_examples=60, deadline=None)
@given(random_gpu_iteration())
def test_property_measured_replay_is_exact(inputs):
    g = build_graph(inputs)
    assert np.array_equal(replay(g), g.measured_times)


@settings(max_examples=40, deadline=None)
@given(random_gpu_iteration(), st.floats(0.1, 3.0))
def test_property_scaling_every_duration_never_breaks_order(inputs, factor):
    g = build_graph(inputs)
    durations = (g.nodes["dur_ns"].to_numpy() * factor).astype(np.int64)
    t = replay(g, durations)
    # every constraint holds in the replay, and each node ends no earlier than it starts
    assert (t[g.dst] >= t[g.src] + edge_lags(g, durations)).all()
    assert (t[1::2] >= t[0::2]).all()

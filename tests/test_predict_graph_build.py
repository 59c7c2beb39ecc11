"""How the dependency graph is built: node order, determinism, the vectorised helpers of the rules.

The graph's meaning is tested in ``test_predict_graph.py``; these tests pin the contracts the fast
build relies on (activity ``i`` is node ``i``, one chunking for the node table, packed join keys)
and that two builds of the same iteration are identical.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from tests.test_predict_graph import RUNTIME_SCHEMA, _node, _ranks, cpu_pipeline, gpu_two_ranks, random_gpu_iteration
from tracecal.errors import PredictionError
from tracecal.predict.edges import EDGE_KINDS, dense_ids, join_on_rank_and_id, lane_ids
from tracecal.predict.graph import ReplayInputs, build_graph
from tracecal.predict.replay import replay


def _edges(g) -> set[tuple[str, int, int, int]]:
    return {
        (EDGE_KINDS[k], int(s), int(d), int(lag)) for s, d, k, lag in zip(g.src, g.dst, g.edge_kind, g.lag, strict=True)
    }


def test_node_i_is_activity_i_and_features_are_the_activities_own_columns():
    inputs = gpu_two_ranks()
    g = build_graph(inputs)
    acts = g.nodes.filter(pl.col("node_kind") == "activity")
    assert acts["node"].to_list() == list(range(inputs.activities.height))
    assert acts["event_id"].to_list() == inputs.activities["event_id"].to_list()
    feats = g.features
    assert feats["node"].to_list() == sorted(feats["node"].to_list())  # node-keyed, in node order
    head = feats.head(inputs.activities.height)
    assert head["name"].to_list() == inputs.activities["name"].to_list()
    # the collective rows carry their collective's name; the instance node is a comm node
    assert head["collective"].to_list() == [None, "all_reduce", None, "all_reduce"]
    inst = g.nodes.filter(pl.col("node_kind") == "collective")["node"].to_list()
    assert feats.filter(pl.col("node").is_in(inst))["family"].to_list() == ["comm"]


def test_duration_roles_after_the_rules():
    g = build_graph(gpu_two_ranks())
    role = dict(zip(zip(g.nodes["rank"], g.nodes["name"], strict=True), g.nodes["duration_role"], strict=True))
    assert role[(0, "gemm")] == "own" and role[(1, "gemm")] == "own"
    assert role[(0, "nccl")] == "coupled" and role[(1, "nccl")] == "coupled"  # they end with the instance
    assert role[(0, "cudaDeviceSynchronize")] == "sync" and role[(1, "cudaDeviceSynchronize")] == "sync"
    assert role[(0, "cudaLaunchKernel")] == "fixed"
    assert g.nodes.filter(pl.col("node_kind") == "collective")["duration_role"].to_list() == ["own"]


def test_node_table_columns_are_chunked_alike():
    """A node table whose columns are chunked differently is copied whole by the next
    ``with_columns`` (gigabytes at 128 ranks); stacking must keep the chunks aligned."""
    for inputs in (gpu_two_ranks(), cpu_pipeline()):
        nodes = build_graph(inputs).nodes
        assert len({nodes[c].n_chunks() for c in nodes.columns}) == 1


@settings(max_examples=25, deadline=None)
@given(random_gpu_iteration())
def test_property_two_builds_are_identical(inputs):
    a, b = build_graph(inputs), build_graph(inputs)
    for name in ("src", "dst", "lag", "edge_kind", "release"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert_frame_equal(a.nodes, b.nodes)
    assert_frame_equal(a.features, b.features)


@settings(max_examples=25, deadline=None)
@given(random_gpu_iteration(), st.randoms(use_true_random=False))
def test_property_input_row_order_does_not_change_the_graph(inputs, rnd):
    """Shuffling the runtime calls renumbers nodes but leaves the same constraints: the replayed
    times of every activity are the same."""
    perm = list(range(inputs.runtime.height))
    rnd.shuffle(perm)
    shuffled = ReplayInputs(inputs.activities, inputs.collectives, inputs.runtime[perm], inputs.ranks)
    a, b = build_graph(inputs), build_graph(shuffled)
    n = inputs.activities.height
    durations_a = (a.nodes["dur_ns"].to_numpy() * 0.5).astype(np.int64)
    durations_b = (b.nodes["dur_ns"].to_numpy() * 0.5).astype(np.int64)
    assert np.array_equal(replay(a, durations_a)[: 2 * n], replay(b, durations_b)[: 2 * n])


def test_exact_ties_on_a_thread_follow_node_order():
    """Two zero-length calls at the same instant on one thread (cudaPeekAtLastError pairs in the
    dlrm traces): the thread chain takes them in input order, build after build."""
    inputs = gpu_two_ranks()
    extra = pl.DataFrame(
        {
            "rank": [0, 0],
            "event_id": [4, 5],
            "name": ["peek_a", "peek_b"],
            "ts_ns": [12, 12],
            "dur_ns": [0, 0],
            "tid": [1, 1],
        },
        schema=RUNTIME_SCHEMA,
    )
    rt = pl.concat([inputs.runtime, extra])
    g = build_graph(ReplayInputs(inputs.activities, inputs.collectives, rt, inputs.ranks))
    a, b = _node(g, 0, "peek_a"), _node(g, 0, "peek_b")
    assert ("thread", 2 * a + 1, 2 * b) in {(k, s, d) for k, s, d, _ in _edges(g)}
    assert np.array_equal(replay(g), g.measured_times)


def test_instance_features_come_from_the_first_member_in_collectives_order():
    def instance_collectives(inputs: ReplayInputs) -> list[str]:
        g = build_graph(inputs)
        inst = g.nodes.filter(pl.col("node_kind") == "collective").select("node", "match_id")
        return inst.join(g.features, on="node").sort("match_id")["collective"].to_list()

    inputs = cpu_pipeline()
    # collectives rows: match 1 is (rank 0 send, rank 1 recv), match 2 is (rank 1 send, rank 0 recv)
    assert instance_collectives(inputs) == ["send", "send"]
    flipped = ReplayInputs(inputs.activities, inputs.collectives.reverse(), inputs.runtime, inputs.ranks)
    assert instance_collectives(flipped) == ["recv", "recv"]


def test_dense_ids_and_lane_ids_order_by_rank_then_lane():
    rank = np.array([3, 1, 3, 1, 2, 3])
    lane = np.array([9, 70000, 5, 9, 5, 9])
    ids, n = dense_ids(lane)
    assert n == 3 and ids.tolist() == [1, 2, 0, 1, 0, 1]
    key = lane_ids(rank, lane)
    pairs = sorted(set(zip(rank.tolist(), lane.tolist(), strict=True)))
    expected = [pairs.index(p) for p in zip(rank.tolist(), lane.tolist(), strict=True)]
    # dense within the rank-major order: comparing ids compares (rank, lane)
    assert np.argsort(key, kind="stable").tolist() == np.argsort(expected, kind="stable").tolist()
    assert len(set(key.tolist())) == len(pairs)


_ids = st.one_of(st.none(), st.integers(-5, 5), st.sampled_from([-(2**61), 2**61]))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 3)), _ids), max_size=12),
    st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 3)), _ids), max_size=12),
)
def test_property_packed_join_equals_the_two_key_join(left_rows, right_rows):
    """Packed keys, or the plain join when they would overflow (the ±2**61 ids), same rows."""
    left = pl.DataFrame(left_rows, schema={"rank": pl.Int64, "eid": pl.Int64}, orient="row").with_row_index("l")
    right = pl.DataFrame(right_rows, schema={"rank": pl.Int64, "eid": pl.Int64}, orient="row").with_row_index("r")
    got = join_on_rank_and_id(left, right, "eid")
    want = left.join(right, on=["rank", "eid"], how="inner")
    assert sorted(got.select("l", "r").rows()) == sorted(want.select("l", "r").rows())
    assert got["l"].to_list() == sorted(got["l"].to_list())  # in left order


def test_cpu_only_ranks_keep_their_markers():
    g = build_graph(cpu_pipeline())
    markers = g.nodes.filter(pl.col("node_kind") == "marker")
    assert sorted(markers["name"].to_list()) == ["iteration_end"] * 2 + ["iteration_start"] * 2
    assert markers["main_tid"].to_list() == [1, 1, 1, 1]
    assert _ranks(2, 1000)["rank"].to_list() == sorted(set(markers["rank"].to_list()))


def test_launch_latency_is_each_ranks_own():
    """Rank r launches its kernels 3 + r ns after the call; its second kernel waits for the busy
    stream, so its launch edge keeps the nominal lag — its own rank's median, never another's."""
    ranks = 48
    lat = 3 + np.arange(ranks)
    rank = np.repeat(np.arange(ranks), 2)
    first = np.tile([True, False], ranks)
    acts = pl.DataFrame(
        {
            "rank": rank,
            "event_id": np.tile([10, 11], ranks),
            "kind": "kernel",
            "name": np.where(first, "a", "b"),
            "ts_ns": np.where(first, lat[rank], lat[rank] + 1000),
            "dur_ns": 1000,
            "stream": 7,
            "cpu_tid": 1,
            "runtime_event_id": np.tile([1, 2], ranks),
            "family": "gemm",
            "component": "compute_fwd",
        }
    )
    rt = pl.DataFrame(
        {
            "rank": rank,
            "event_id": np.tile([1, 2], ranks),
            "name": "cudaLaunchKernel",
            "ts_ns": np.tile([0, 20], ranks),
            "dur_ns": 10,
            "tid": 1,
        },
        schema=RUNTIME_SCHEMA,
    )
    coll = pl.DataFrame(schema={"rank": pl.Int64, "event_id": pl.Int64, "match_id": pl.Int64, "name": pl.String,
                                "role": pl.String})  # fmt: skip
    g = build_graph(ReplayInputs(acts, coll, rt, _ranks(ranks, 3000)))
    launch = g.edge_kind == EDGE_KINDS.index("launch")
    assert launch.sum() == 2 * ranks
    dst_rank = g.nodes["rank"].to_numpy()[g.dst[launch] // 2]
    assert np.array_equal(g.lag[launch], lat[dst_rank])
    assert np.array_equal(replay(g), g.measured_times)


def test_a_node_without_a_time_is_refused():
    """A NULL time would become a garbage int64 in numpy, and the replay would reproduce it."""
    inputs = cpu_pipeline()
    no_window = inputs.ranks.with_columns(
        pl.when(pl.col("rank") == 1).then(None).otherwise(pl.col("window_start_ns")).alias("window_start_ns")
    )
    with pytest.raises(PredictionError, match="rank 1: marker 'iteration_start' has no time"):
        build_graph(ReplayInputs(inputs.activities, inputs.collectives, inputs.runtime, no_window))
    no_ts = inputs.activities.with_columns(
        pl.when(pl.col("name") == "D").then(None).otherwise(pl.col("ts_ns")).alias("ts_ns")
    )
    with pytest.raises(PredictionError, match="rank 1: activity 'D' has no time"):
        build_graph(ReplayInputs(no_ts, inputs.collectives, inputs.runtime, inputs.ranks))

"""The two replays and the unexplained slack, on tiny iterations whose answers can be checked by hand."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.test_predict_graph import RUNTIME_SCHEMA, _node, _ranks, cpu_pipeline, gpu_two_ranks
from tracecal.errors import PredictionError
from tracecal.predict.edges import EDGE_KINDS
from tracecal.predict.graph import ReplayInputs, build_graph
from tracecal.predict.replay import replay
from tracecal.predict.run import predict_iteration, result_tables, slack_report
from tracecal.predict.slack import binding_edges, by_component, landing, unexplained


def late_kernel() -> ReplayInputs:
    """One GPU rank whose second kernel starts 20 ns later than anything in the trace explains.

    launch [0,10] -> k1 [15,40] (stream idle: launch latency 15); launch [20,30] -> k2 [60,100].
    k2 could start at max(stream 40, launch 20 + 15) = 40: 20 ns of slack, absorbed on the stream edge.
    """
    acts = pl.DataFrame(
        {
            "rank": [0, 0],
            "event_id": [10, 11],
            "kind": ["kernel", "kernel"],
            "name": ["k1", "k2"],
            "ts_ns": [15, 60],
            "dur_ns": [25, 40],
            "stream": [7, 7],
            "cpu_tid": [1, 1],
            "runtime_event_id": [1, 2],
            "family": ["gemm", "elementwise"],
            "component": ["compute_fwd", "compute_bwd"],
        }
    )
    rt = pl.DataFrame(
        {"rank": [0, 0], "event_id": [1, 2], "name": ["cudaLaunchKernel"] * 2, "ts_ns": [0, 20], "dur_ns": [10, 10]},
        schema={k: v for k, v in RUNTIME_SCHEMA.items() if k != "tid"},
    ).with_columns(pl.lit(1, pl.Int64).alias("tid"))
    coll = pl.DataFrame(schema={"rank": pl.Int64, "event_id": pl.Int64, "match_id": pl.Int64, "name": pl.String})
    return ReplayInputs(acts, coll.with_columns(pl.lit(None, pl.String).alias("role")), rt, _ranks(1, 100))


def test_the_fit_records_what_it_absorbed_and_the_dependency_replay_leaves_it_out() -> None:
    g = build_graph(late_kernel())
    k1, k2 = _node(g, 0, "k1"), _node(g, 0, "k2")
    assert g.absorbed.ns.tolist() == [20]
    (edge,) = g.absorbed.edge
    assert EDGE_KINDS[g.edge_kind[edge]] == "stream" and g.dst[edge] == 2 * k2 and g.src[edge] == 2 * k1 + 1
    assert np.array_equal(replay(g), g.measured_times)  # the fitted replay is exact
    dep = replay(g, kind="dependency").reshape(-1, 2)
    assert dep[k1].tolist() == [15, 40] and dep[k2].tolist() == [40, 80]
    with pytest.raises(PredictionError, match="unknown replay"):
        replay(g, kind="exact")


def test_unexplained_is_the_slack_on_the_critical_path() -> None:
    g = build_graph(late_kernel())
    k2 = _node(g, 0, "k2")
    slack = unexplained(g, g.measured_times, g.lag)
    assert slack.select("rank", "node", "point", "slack_ns", "family", "component").rows() == [
        (0, k2, "start", 20, "elementwise", "compute_bwd")
    ]
    assert by_component(slack).rows() == [(0, "compute_bwd", 20), (0, "iteration", 20)]
    assert landing(slack).rows() == [(0, "elementwise start", 20)]
    # the binding edge of k2's start is the stream edge that carries the slack
    assert binding_edges(g, g.measured_times, g.lag)[2 * k2] == g.absorbed.edge[0]


def test_absorbed_slack_is_a_fixed_lag_when_durations_change() -> None:
    g = build_graph(late_kernel())
    p = predict_iteration(g, mode="scaled", scale={"gemm": 0.5})
    fitted, dep = p.by_replay("fitted"), p.by_replay("dependency")
    assert fitted is p and dep is p.other
    k1, k2 = _node(g, 0, "k1"), _node(g, 0, "k2")
    # k1 ends at 15 + 12 (25 ns halved, rounded to even); the fitted replay still waits 20 ns after it,
    # the dependency replay starts k2 at its launch (20 + latency 15)
    assert p.replayed.reshape(-1, 2)[k2].tolist() == [47, 87]
    assert dep.replayed.reshape(-1, 2)[k2].tolist() == [35, 75]
    assert p.replayed.reshape(-1, 2)[k1].tolist() == [15, 27]
    assert fitted.unexplained["slack_ns"].to_list() == [20]
    assert dep.unexplained.height == 0


def test_report_and_stored_rows_of_both_replays() -> None:
    p = predict_iteration(build_graph(late_kernel()))
    it = slack_report(p).filter(pl.col("component") == "iteration").row(0, named=True)
    # measured span [15, 100] = 85 ns; the dependency replay ends at 80: 65 ns
    assert it["dependency_error_pct"] == pytest.approx(-20 / 85 * 100)
    assert it["unexplained_pct"] == pytest.approx(20 / 85 * 100)
    preds, comps = result_tables(p)
    assert comps["replay"].value_counts().sort("replay").rows() == [("dependency", 12), ("fitted", 12)]
    row = comps.filter(pl.col("component") == "compute_bwd").sort("replay").select("replay", "unexplained_ns")
    assert row.rows() == [("dependency", 0), ("fitted", 20)]
    k2 = preds.filter(pl.col("event_id") == 11).sort("replay")
    assert k2.select("replay", "replay_start_ns", "unexplained_ns").rows() == [
        ("dependency", 25, 0),
        ("fitted", 45, 20),
    ]
    # a dependency-first prediction reports the same numbers
    q = predict_iteration(build_graph(late_kernel()), replay="dependency")
    assert q.replay == "dependency" and q.other is not None and q.other.replay == "fitted"
    assert slack_report(q).equals(slack_report(p))
    alone = predict_iteration(build_graph(late_kernel()), compare=False)
    assert alone.other is None
    assert slack_report(alone)["dependency_error_pct"].null_count() == 12


def test_slack_off_the_critical_path_is_not_unexplained() -> None:
    """gpu_two_ranks: rank 1's all-reduce kernel starts 5 ns after anything explains it, but both
    ranks wait for rank 0's kernel to join the collective, so neither iteration depends on it."""
    g = build_graph(gpu_two_ranks())
    assert g.absorbed.ns.tolist() == [5]
    assert g.dst[g.absorbed.edge[0]] == 2 * _node(g, 1, "nccl")
    p = predict_iteration(g)
    assert p.unexplained.height == 0
    report = slack_report(p).filter(pl.col("component") == "iteration")
    assert report["dependency_error_pct"].to_list() == [0.0, 0.0]
    assert report["unexplained_pct"].to_list() == [0.0, 0.0]


def test_cpu_only_ranks_keep_measured_gaps_so_nothing_is_absorbed() -> None:
    g = build_graph(cpu_pipeline())
    assert g.absorbed.edge.size == 0
    assert np.array_equal(replay(g, kind="dependency"), replay(g))


def busy_stream_at_start(*, carry_in: bool) -> ReplayInputs:
    """One GPU rank whose CPU ran ahead: k1 was launched at 0 but its stream was still busy with the
    previous iteration's work until 50; then a copy to pageable host memory blocks its call, and two
    kernels follow on an idle stream (launch latency 10).

    launch [0,10] -> k1 [50,90]; cudaMemcpyAsync [20,105] -> copy [90,100] (returns 5 after it ends);
    launch [110,115] -> k2 [120,130]; launch [140,145] -> k3 [150,160].
    """
    acts = pl.DataFrame(
        {
            "rank": [0] * 4,
            "event_id": [10, 11, 12, 13],
            "kind": ["kernel", "memcpy", "kernel", "kernel"],
            "name": ["k1", "Memcpy DtoH (Device -> Pageable)", "k2", "k3"],
            "ts_ns": [50, 90, 120, 150],
            "dur_ns": [40, 10, 10, 10],
            "stream": [7] * 4,
            "cpu_tid": [1] * 4,
            "runtime_event_id": [1, 2, 3, 4],
            "family": ["gemm", "memcpy", "elementwise", "elementwise"],
            "component": ["compute_fwd", "memcpy", "compute_fwd", "compute_fwd"],
        }
    )
    rt = pl.DataFrame(
        {
            "rank": [0] * 4,
            "event_id": [1, 2, 3, 4],
            "name": ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaLaunchKernel", "cudaLaunchKernel"],
            "ts_ns": [0, 20, 110, 140],
            "dur_ns": [10, 85, 5, 5],
            "tid": [1] * 4,
        },
        schema=RUNTIME_SCHEMA,
    )
    coll = pl.DataFrame(
        schema={"rank": pl.Int64, "event_id": pl.Int64, "match_id": pl.Int64, "name": pl.String, "role": pl.String}
    )
    if not carry_in:
        return ReplayInputs(acts, coll, rt, _ranks(1, 170))
    before = pl.DataFrame({"rank": [0], "stream": [7], "busy_until_ns": [50]})
    return ReplayInputs(acts, coll, rt, _ranks(1, 170), carry_in=before)


def test_a_stream_busy_before_the_iteration_holds_its_first_kernel_back() -> None:
    # without the carry-in, the first kernel can start right after its launch: the dependency replay
    # moves the iteration's start 40 ns earlier and the span grows by that much
    loose = build_graph(busy_stream_at_start(carry_in=False))
    k1 = _node(loose, 0, "k1")
    assert replay(loose, kind="dependency").reshape(-1, 2)[k1, 0] == 10
    # with it, the stream's earlier work is a fixed point before k1 and nothing is left unexplained
    g = build_graph(busy_stream_at_start(carry_in=True))
    k1 = _node(g, 0, "k1")
    assert g.nodes.filter(pl.col("node_kind") == "carry_in")["start_ns"].to_list() == [50]
    dep = replay(g, kind="dependency").reshape(-1, 2)
    assert dep[k1].tolist() == [50, 90]
    assert g.absorbed.ns.size == 0
    # a carry-in is no operator and not in the span: the iteration runs from k1's start to k3's end
    assert predict_iteration(g).iteration_error()["predicted_ns"].to_list() == [110]


def test_a_call_that_returns_after_its_own_copy_waits_for_it_once() -> None:
    g = build_graph(busy_stream_at_start(carry_in=True))
    call = g.nodes.filter(pl.col("name") == "cudaMemcpyAsync")["node"].item()
    copy = _node(g, 0, "Memcpy DtoH (Device -> Pageable)")
    assert g.nodes["duration_role"][call] == "sync"
    sync = np.flatnonzero((g.edge_kind == EDGE_KINDS.index("sync")) & (g.dst == 2 * call + 1))
    assert g.src[sync].tolist() == [2 * copy + 1] and g.lag[sync].tolist() == [5]
    assert np.array_equal(replay(g, kind="dependency"), g.measured_times)
    # the wait is not held in the call's duration: when the kernel before the copy takes 30 ns
    # longer, the call returns 30 ns later, and when it takes 30 ns less, 30 ns earlier (no earlier
    # than its start plus the return latency)
    k1 = _node(g, 0, "k1")
    for delta in (30, -30):
        dur = g.nodes["dur_ns"].to_numpy().copy()
        dur[k1] += delta
        t = replay(g, dur, kind="dependency").reshape(-1, 2)
        assert t[call, 1] == 105 + delta

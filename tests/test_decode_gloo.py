"""Golden tests for gloo work ranges in CPU-only traces: which call enqueued each range, and how the
ranges are named, ordered and matched across ranks.

gloo's ranges are not nested like a call stack: a send's range runs asynchronously and outlasts the
calls after it on the same thread, and all-reduces run on several worker threads, so a range enqueued
later may start first. Timestamps are small integers a person can check by hand.
"""

from __future__ import annotations

from typing import Any

import polars as pl
from decode_helpers import events, op, step

from tracecal.decode.align import match_collectives
from tracecal.decode.rank import decode_rank
from tracecal.vocabulary import ParallelLayout

PP2 = ParallelLayout(world_size=2, pp=2, tp=1, dp=1)
DP2 = ParallelLayout(world_size=2, pp=1, tp=1, dp=2)


def scope(name: str, ts: int, dur: int) -> dict[str, Any]:
    return {"kind": "user_annotation", "name": name, "ts": ts, "dur": dur}


def call(name: str, ts: int, elems: int, dur: int = 100) -> dict[str, Any]:
    """A ``c10d::`` call on the training thread (tid 1) with one tensor of ``elems`` floats."""
    return op(name, ts, dur, input_dims=f"[[[{elems}]],[],[],[]]", input_types='["TensorList","Int","Int","Int"]')


def work(name: str, ts: int, dur: int, elems: int, tid: int = 1) -> dict[str, Any]:
    """A ``gloo:`` work range of one tensor of ``elems`` floats."""
    return {
        "kind": "user_annotation",
        "name": name,
        "ts": ts,
        "dur": dur,
        "tid": tid,
        "input_dims": f"[[{elems}]]",
        "input_types": '["float"]',
    }


def p2p(kind: str, scope_name: str, ts: int, work_dur: int) -> list[dict[str, Any]]:
    """A pipeline transfer on the training thread: scope, ``c10d::`` call, then the gloo range
    starting inside the call and lasting ``work_dur`` (async sends outlast what follows)."""
    c10d = "c10d::send" if kind == "send" else "c10d::recv_"
    return [scope(scope_name, ts, 300), call(c10d, ts + 10, 8), work(f"gloo:{kind}", ts + 50, work_dur, 8)]


def test_an_async_send_range_enclosing_the_next_recv_does_not_rename_it() -> None:
    # stage 0 sends activations and receives gradients; each send's range is still open when the
    # recv after it is called and started (as in a gloo PP run); stage 1 mirrors it
    r0 = [
        step(1, 0, 100_000),
        *p2p("send", "_exec_send_activations", 1_000, 20_000),
        *p2p("recv", "_exec_recv_grads", 2_000, 5_000),  # inside the first send's range
        *p2p("send", "_exec_send_activations", 30_000, 20_000),
        *p2p("recv", "_exec_recv_grads", 31_000, 4_000),  # inside the second send's range
    ]
    r1 = [
        step(1, 0, 100_000),
        *p2p("recv", "_exec_recv_activations", 1_020, 500),
        *p2p("send", "_exec_send_grads", 1_900, 40_000),  # still open at the next recv
        *p2p("recv", "_exec_recv_activations", 30_020, 500),
        *p2p("send", "_exec_send_grads", 30_900, 5_000),
    ]
    decoded = [decode_rank(events(r, rank=i), rank=i, layout=PP2) for i, r in enumerate((r0, r1))]
    colls = match_collectives(pl.concat([d.collectives for d in decoded]))
    got = colls.sort("rank", "ts_ns").select("rank", "event_id", "name", "peer", "role", "size_bytes")
    assert got.rows() == [
        (0, 3, "send", 1, "pp", 32),
        (0, 6, "recv", 1, "pp", 32),
        (0, 9, "send", 1, "pp", 32),
        (0, 12, "recv", 1, "pp", 32),
        (1, 3, "recv", 0, "pp", 32),
        (1, 6, "send", 0, "pp", 32),
        (1, 9, "recv", 0, "pp", 32),
        (1, 12, "send", 0, "pp", 32),
    ]
    ids = {(r, e): m for r, e, m in colls.select("rank", "event_id", "match_id").rows()}
    # each send is matched with the peer's recv of the same order, and nothing else
    assert ids[(0, 3)] == ids[(1, 3)] and ids[(0, 9)] == ids[(1, 9)]
    assert ids[(1, 6)] == ids[(0, 6)] and ids[(1, 12)] == ids[(0, 12)]
    assert len(set(ids.values())) == 4 and None not in ids.values()


def test_work_pairs_with_its_call_by_message_when_worker_threads_start_out_of_order() -> None:
    calls = [call("c10d::allreduce_", 100, 1000, 10), call("c10d::allreduce_", 120, 24, 10)]
    calls += [call("c10d::allreduce_", 140, 1000, 10)]
    r0 = [
        step(1, 0, 1_000),
        work("gloo:all_reduce", 50, 30, 1000, tid=8),  # 1: enqueued before the capture (no call before it)
        *calls,  # 2, 3, 4
        work("gloo:all_reduce", 150, 100, 1000, tid=8),  # 5: call 2
        work("gloo:all_reduce", 160, 50, 24, tid=9),  # 6: call 3
        work("gloo:all_reduce", 260, 100, 1000, tid=8),  # 7: call 4
    ]
    r1 = [
        step(1, 0, 1_000),
        *calls,  # 1, 2, 3
        work("gloo:all_reduce", 130, 50, 24, tid=9),  # 4: call 2 (the second call) starts first
        work("gloo:all_reduce", 135, 100, 1000, tid=8),  # 5: call 1
        work("gloo:all_reduce", 240, 100, 1000, tid=8),  # 6: call 3
    ]
    decoded = [decode_rank(events(r, rank=i), rank=i, layout=DP2) for i, r in enumerate((r0, r1))]
    colls = match_collectives(pl.concat([d.collectives for d in decoded]))
    got = colls.sort("rank", "seq_in_group", "ts_ns", nulls_last=True).select(
        "rank", "event_id", "size_bytes", "linked", "role"
    )
    assert got.rows() == [
        (0, 5, 4000, True, "dp"),
        (0, 6, 96, True, "dp"),
        (0, 7, 4000, True, "dp"),
        (0, 1, 4000, False, "dp"),  # not numbered: the other rank may not have it
        (1, 5, 4000, True, "dp"),
        (1, 4, 96, True, "dp"),
        (1, 6, 4000, True, "dp"),
    ]
    ids = {(r, e): m for r, e, m in colls.select("rank", "event_id", "match_id").rows()}
    assert ids[(0, 5)] == ids[(1, 5)] and ids[(0, 6)] == ids[(1, 4)] and ids[(0, 7)] == ids[(1, 6)]
    assert len({ids[(0, 5)], ids[(0, 6)], ids[(0, 7)]}) == 3 and ids[(0, 1)] is None


def test_ranges_whose_message_the_call_does_not_show_pair_by_kind() -> None:
    # an all-gather's call shows the output list (world x shard), its range the input shard
    ev = events(
        [
            step(1, 0, 1_000),
            op("c10d::allgather_", 100, 20, input_dims="[[[8],[8]],[[8]],[],[]]"),  # 1
            work("gloo:all_gather", 130, 50, 8, tid=9),  # 2
        ]
    )
    d = decode_rank(ev, rank=0, layout=DP2)
    c = d.collectives.row(0, named=True)
    assert (c["event_id"], c["name"], c["linked"], c["size_bytes"]) == (2, "all_gather", True, 64)

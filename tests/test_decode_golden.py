"""Golden tests on tiny traces built in code: linking, phases, iterations, collectives, matching,
clock alignment, best iteration. Timestamps are small integers a person can check by hand."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from decode_helpers import events, kernel, launch, op, step

from tracecal.decode.align import apply_offsets, best_iteration, clock_offsets, match_collectives
from tracecal.decode.collectives import busbw_factor, normalize_collective, role_of_group
from tracecal.decode.rank import decode_rank
from tracecal.errors import RunNotFoundError, TraceFormatError
from tracecal.pipeline.decode import decode_stored_run
from tracecal.sql.connection import open_database
from tracecal.vocabulary import ParallelLayout

NO_LAYOUT = ParallelLayout(world_size=2)


def by_id(frame: pl.DataFrame, event_id: int) -> dict:
    return frame.filter(pl.col("event_id") == event_id).row(0, named=True)


def test_linking_external_id_time_fallback_and_unlinked() -> None:
    ev = events(
        [
            step(1, 0, 1000),  # 0
            op("aten::linear", 10, 200, external_id=5),  # 1
            op(
                "aten::addmm",
                20,
                100,
                external_id=6,
                input_dims="[[512],[8,256],[256,512]]",
                input_types='["float","float","float"]',
            ),  # 2
            launch(100, 30, external_id=6),  # 3: External id -> aten::addmm
            op("aten::mul", 300, 50),  # 4: no External id (Nsight-like)
            launch(101, 310),  # 5: time -> innermost enclosing cpu_op: aten::mul
            launch(102, 600),  # 6: no enclosing cpu_op at all
            kernel("volta_sgemm_128x32_nt", 100, 40, 30),  # 7
            kernel("vectorized_elementwise_kernel", 101, 320, 5),  # 8
            kernel("vectorized_elementwise_kernel", 102, 610, 5),  # 9: runtime but no op
            kernel("vectorized_elementwise_kernel", 999, 700, 5),  # 10: no runtime at all
        ]
    )
    out = decode_rank(ev, rank=0, layout=NO_LAYOUT).operators
    assert out.height == 4  # every GPU activity is an operator, linked or not
    gemm = by_id(out, 7)
    assert (gemm["runtime_event_id"], gemm["cpu_op_event_id"], gemm["link"]) == (3, 2, "external_id")
    assert (gemm["cpu_op_name"], gemm["family"], gemm["m"], gemm["n"], gemm["k"]) == (
        "aten::addmm",
        "gemm",
        8,
        512,
        256,
    )
    assert gemm["flops"] == 2 * 8 * 512 * 256
    mul = by_id(out, 8)
    assert (mul["runtime_event_id"], mul["cpu_op_event_id"], mul["link"]) == (5, 4, "time")
    assert (by_id(out, 9)["runtime_event_id"], by_id(out, 9)["cpu_op_event_id"], by_id(out, 9)["link"]) == (
        6,
        None,
        "none",
    )
    lone = by_id(out, 10)
    assert (lone["runtime_event_id"], lone["cpu_op_event_id"], lone["link"]) == (None, None, "none")
    assert out["family"].null_count() == 0 and out["phase"].null_count() == 0


def test_innermost_operator_wins_and_wrong_external_id_is_not_trusted() -> None:
    ev = events(
        [
            op("aten::matmul", 0, 100, external_id=1),  # 0
            op("aten::mm", 10, 50, external_id=2),  # 1
            launch(7, 20, external_id=1),  # 2: its External id names the outer op: still a cpu_op
            op("aten::add", 200, 50, external_id=3),  # 3
            launch(8, 210, external_id=1),  # 4: External id points at an op that does not enclose it
            kernel("k1", 7, 30, 5),  # 5
            kernel("k2", 8, 220, 5),  # 6
        ]
    )
    out = decode_rank(ev, rank=0, layout=NO_LAYOUT).operators
    assert (by_id(out, 5)["cpu_op_event_id"], by_id(out, 5)["link"]) == (0, "external_id")
    # the External id link is refused (op 0 ended before the launch): the time link finds aten::add
    assert (by_id(out, 6)["cpu_op_event_id"], by_id(out, 6)["link"]) == (3, "time")


def test_phases_from_autograd_scopes_and_position() -> None:
    ev = events(
        [
            step(3, 0, 10_000),  # 0
            {"kind": "user_annotation", "name": "## forward ##", "ts": 10, "dur": 990},  # 1
            op("aten::mm", 100, 50),  # 2
            launch(1, 110),  # 3
            op("aten::relu", 1_100, 50),  # 4: no scope, before the first backward op -> fwd by position
            launch(2, 1_110),  # 5
            op("autograd::engine::evaluate_function: MmBackward0", 2_000, 500, tid=2),  # 6
            op("aten::mm", 2_100, 100, tid=2),  # 7
            launch(3, 2_150, tid=2),  # 8
            op("aten::add", 3_000, 50),  # 9: between backward ops -> bwd by position
            launch(4, 3_010),  # 10
            op("aten::mul", 3_500, 50, tid=2, fwd_thread_id=1),  # 11: Fwd thread id -> autograd
            launch(5, 3_510, tid=2),  # 12
            op("Optimizer.step#AdamW.step", 5_000, 1_000),  # 13
            op("aten::_foreach_add_", 5_100, 100),  # 14
            launch(6, 5_110),  # 15
            op("aten::copy_", 8_000, 10),  # 16: after the last backward op, no scope -> other
            launch(7, 8_001),  # 17
        ]
    )
    ev = pl.concat(
        [
            ev,
            events([kernel(f"k{c}", c, 20_000 + 10 * c, 5) for c in range(1, 8)]).with_columns(
                (pl.col("event_id") + 100).alias("event_id")
            ),
        ]
    )
    out = decode_rank(ev, rank=0, layout=NO_LAYOUT).operators.sort("correlation")
    assert out["phase"].to_list() == ["fwd", "fwd", "bwd", "bwd", "bwd", "optimizer", "other"]
    assert out["component"].to_list() == [
        "compute_fwd",
        "compute_fwd",
        "compute_bwd",
        "compute_bwd",
        "compute_bwd",
        "optimizer",
        "other",
    ]
    assert out["iteration"].to_list() == [3] * 7  # launched in step 3 although they run after it


def test_iterations_by_launch_window_and_markers() -> None:
    ev = events(
        [
            step(1, 0, 100),  # 0
            op("aten::mm", 10, 80),  # 1
            launch(1, 90),  # 2: launched at the end of step 1 ...
            step(2, 100, 100),  # 3
            op("aten::mm", 110, 50),  # 4
            launch(2, 120),  # 5
            kernel("k", 1, 150, 40),  # 6: ... runs during step 2's CPU window: still iteration 1
            kernel("k", 2, 190, 60),  # 7
        ]
    )
    d = decode_rank(ev, rank=0, layout=NO_LAYOUT)
    assert by_id(d.operators, 6)["iteration"] == 1 and by_id(d.operators, 7)["iteration"] == 2
    its = d.iterations.sort("iteration")
    assert its["iteration"].to_list() == [1, 2]
    assert its.select("gpu_start_ns", "gpu_end_ns", "dur_ns").rows() == [(150, 190, 40), (190, 250, 60)]
    assert d.markers_found
    # no markers: one iteration over the capture, said so
    plain = decode_rank(ev.filter(~pl.col("name").str.starts_with("ProfilerStep")), rank=0, layout=NO_LAYOUT)
    assert plain.iterations["iteration"].to_list() == [0] and not plain.markers_found
    assert plain.operators["iteration"].to_list() == [0, 0]
    # a framework marker given as a regex
    custom = decode_rank(
        pl.concat([ev, events([op("train_batch", 5, 240)]).with_columns(pl.lit(50, dtype=pl.Int64).alias("event_id"))]),
        rank=0,
        layout=NO_LAYOUT,
        marker="^train_batch$",
    )
    assert custom.iterations["iteration"].to_list() == [0] and custom.markers_found
    with pytest.raises(TraceFormatError, match="not a valid regex"):
        decode_rank(ev, rank=0, layout=NO_LAYOUT, marker="(")


def _rank_with_allreduce(rank: int, shift: int, dur: int, extra: list | None = None) -> pl.DataFrame:
    """One rank: a step, an all-reduce (args on record_param_comms) and a kernel; clock shifted."""
    rows = [
        step(1, 0, 1_000),
        op("c10d::allreduce_", 100, 100),
        op(
            "record_param_comms",
            105,
            90,
            coll_name="allreduce",
            in_msg_nelems=1024,
            out_msg_nelems=1024,
            coll_dtype="BFloat16",
            group_size=2,
            pg_name="0",
            pg_ranks="[0, 1]",
        ),
        launch(10, 110),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclDevComm*, unsigned long, ncclWork*)", 10, 500 - dur, dur),
        *(extra or []),
    ]
    ev = events(rows, rank=rank)
    return ev.with_columns(pl.col("ts_ns") + shift)


def test_collectives_sizes_matching_alignment_and_best_iteration() -> None:
    decoded = [
        decode_rank(_rank_with_allreduce(0, 0, 100), rank=0, layout=NO_LAYOUT),
        decode_rank(_rank_with_allreduce(1, 5_000, 300), rank=1, layout=NO_LAYOUT),  # clock 5 µs ahead
    ]
    colls = pl.concat([d.collectives for d in decoded])
    row = colls.row(0, named=True)
    assert (row["name"], row["size_bytes"], row["dtype"], row["group_size"]) == ("all_reduce", 2048, "bfloat16", 2)
    assert row["algbw_gbps"] == pytest.approx(2048 / 100)
    assert row["busbw_gbps"] == pytest.approx(2048 / 100 * 2 * (2 - 1) / 2)
    matched = match_collectives(colls)
    assert matched["match_id"].to_list() == [0, 0]
    offsets = clock_offsets(matched.with_columns((pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns")), [0, 1])
    assert offsets.rows() == [(0, 0, 0), (1, -5_000, 0)]
    its = pl.concat([d.iterations for d in decoded])
    its, _ = apply_offsets(its, matched, offsets)
    assert its.sort("rank")["aligned_end_ns"].to_list() == [500, 500]  # ends coincide after alignment
    best = best_iteration(its)
    assert best.select("iteration", "dur_ns", "slowest_rank").row(0) == (1, 300, 1)


def test_matching_needs_agreeing_names_and_pairs_send_recv() -> None:
    base = {"rank": 0, "group_key": "g", "coll_seq": None, "peer": None, "ts_ns": 0, "size_bytes": 64}
    rows = [
        {**base, "name": "all_reduce", "seq_in_group": 0},
        {**base, "rank": 1, "name": "all_gather", "seq_in_group": 0},  # disagrees: not matched
        {**base, "name": "send", "peer": 1, "seq_in_group": 1, "ts_ns": 10},
        {**base, "rank": 1, "name": "recv", "peer": 0, "seq_in_group": 1, "ts_ns": 12},
        {**base, "name": "send", "peer": 1, "seq_in_group": 2, "ts_ns": 20},
        {**base, "rank": 1, "name": "recv", "peer": 0, "seq_in_group": 2, "ts_ns": 22},
        {**base, "name": "all_reduce", "seq_in_group": 3},
        {**base, "rank": 1, "name": "all_reduce", "seq_in_group": 3, "size_bytes": 128},  # sizes disagree
        {**base, "name": "all_to_all", "seq_in_group": 4},
        {**base, "rank": 1, "name": "all_to_all", "seq_in_group": 4, "size_bytes": 128},  # uneven splits: fine
    ]
    out = match_collectives(pl.DataFrame(rows, schema_overrides={"peer": pl.Int32, "coll_seq": pl.Int64}))
    ids = out["match_id"].to_list()
    assert ids[0] is None and ids[1] is None
    assert ids[2] == ids[3] and ids[4] == ids[5] and ids[2] != ids[4]
    assert ids[6] is None and ids[7] is None
    assert ids[8] is not None and ids[8] == ids[9]


def test_cpu_only_rank_leaf_operators_and_gloo_collectives() -> None:
    ev = events(
        [
            step(7, 0, 1_000),  # 0
            op("aten::linear", 10, 100),  # 1: parent
            op("aten::addmm", 20, 50),  # 2: leaf
            op("c10d::allreduce_", 200, 20),  # 3: leaf (enqueues the gloo work)
            {
                "kind": "user_annotation",
                "name": "gloo:all_reduce",
                "ts": 210,
                "dur": 400,
                "tid": 9,
                "input_dims": "[[1000]]",
                "input_types": '["float"]',
            },  # 4: the work itself
        ]
    )
    d = decode_rank(ev, rank=3, layout=ParallelLayout(world_size=4))
    assert not d.gpu
    assert sorted(d.operators["event_id"].to_list()) == [2, 3, 4]
    assert set(d.operators["link"].to_list()) == {"self"}
    c = d.collectives.row(0, named=True)
    assert (c["event_id"], c["name"], c["size_bytes"], c["group_size"]) == (4, "all_reduce", 4000, 4)
    assert d.iterations.select("iteration", "gpu_start_ns", "dur_ns").row(0) == (7, None, 1_000)


def test_roles_from_layout_and_names() -> None:
    lay = ParallelLayout(world_size=16, pp=2, tp=4, dp=2)  # Megatron: rank = pp*8 + dp*4 + tp
    assert role_of_group([0, 1, 2, 3], lay) == "tp"
    assert role_of_group([1, 5], lay) == "dp"
    assert role_of_group([3, 11], lay) == "pp"
    assert role_of_group([0, 2], lay) is None
    assert role_of_group(list(range(16)), ParallelLayout(world_size=16, pp=1, tp=1, dp=16)) == "dp"
    assert role_of_group([0, 1], ParallelLayout(world_size=2)) is None  # layout unknown
    assert normalize_collective("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "all_gather"
    assert normalize_collective("nccl:_all_gather_base") == "all_gather"
    assert normalize_collective("c10d::alltoall_base_") == "all_to_all"
    assert normalize_collective("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t") is None
    assert normalize_collective("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)") is None
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather", 4) == pytest.approx(0.75)
    assert busbw_factor("send", 2) == 1.0


def test_send_recv_peers_from_args_and_pairing() -> None:
    def rank_events(rank: int, coll: str, peer_arg: dict) -> pl.DataFrame:
        rows = [step(1, 0, 1_000)]
        for i in range(2):  # two transfers in the same direction
            base = 100 + 300 * i
            rows += [
                op(
                    "record_param_comms",
                    base,
                    50,
                    coll_name=coll,
                    in_msg_nelems=256,
                    out_msg_nelems=256,
                    coll_dtype="Float",
                    pg_name="3",
                    pg_ranks="[0, 1, 2, 3]",
                    group_size=4,
                    **peer_arg,
                ),
                launch(10 + i, base + 10),
                kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 10 + i, base + 100, 20),
            ]
        return events(rows, rank=rank)

    d0 = decode_rank(rank_events(0, "send", {"dst_rank": 1}), rank=0, layout=ParallelLayout(world_size=4))
    d1 = decode_rank(rank_events(1, "recv", {"src_rank": 0}), rank=1, layout=ParallelLayout(world_size=4))
    both = match_collectives(pl.concat([d0.collectives, d1.collectives]))
    assert both.select("rank", "name", "peer", "size_bytes").rows() == [
        (0, "send", 1, 1024),
        (0, "send", 1, 1024),
        (1, "recv", 0, 1024),
        (1, "recv", 0, 1024),
    ]
    ids = both["match_id"].to_list()
    assert ids[0] == ids[2] and ids[1] == ids[3] and ids[0] != ids[1]
    assert both["busbw_gbps"].to_list() == pytest.approx([1024 / 20] * 4)


def test_gloo_work_linked_to_its_c10d_call_role_group_and_peer_from_layout() -> None:
    # rank 1 of pp=2 x tp=2 x dp=1 (Megatron order): TP group [0, 1], next pipeline stage is rank 3
    ev = events(
        [
            step(1, 0, 10_000),  # 0
            op("_ReduceFromModelParallelRegion", 100, 300),  # 1
            op("c10d::allreduce_", 110, 20),  # 2
            {
                "kind": "user_annotation",
                "name": "gloo:all_reduce",
                "ts": 140,
                "dur": 200,
                "tid": 9,
                "input_dims": "[[2,128,256]]",
                "input_types": '["float"]',
            },  # 3: on a gloo thread
            {"kind": "user_annotation", "name": "_exec_send_activations", "ts": 1_000, "dur": 100},  # 4
            op("c10d::send", 1_010, 20),  # 5
            {
                "kind": "user_annotation",
                "name": "gloo:send",
                "ts": 1_040,
                "dur": 500,
                "tid": 8,
                "input_dims": "[[2,128,256]]",
                "input_types": '["float"]',
            },  # 6
            op("aten::mm", 2_000, 100, input_dims="[[256,128],[128,256]]", input_types='["float","float"]'),  # 7
            op("aten::empty", 2_010, 5),  # 8: metadata only, the mm stays the leaf
        ],
        rank=1,
    )
    d = decode_rank(ev, rank=1, layout=ParallelLayout(world_size=4, pp=2, tp=2, dp=1))
    c = d.collectives.sort("ts_ns").select("event_id", "name", "role", "group_key", "group_size", "peer", "pg_ranks")
    assert c.rows() == [(3, "all_reduce", "tp", "[0,1]", 2, None, None), (6, "send", "pp", "[1,3]", 2, 3, None)]
    ops = d.operators.sort("event_id")
    assert ops["event_id"].to_list() == [2, 3, 5, 6, 7]
    assert by_id(ops, 3)["component"] == "comm_tp" and by_id(ops, 6)["component"] == "comm_pp"
    assert (by_id(ops, 7)["family"], by_id(ops, 7)["flops"]) == ("gemm", 2 * 256 * 128 * 256)


def test_decode_stored_run_without_events_writes_nothing(tmp_path: Path, template_cache: Path) -> None:
    with open_database(tmp_path / "t.duckdb", cache_dir=template_cache) as con:
        con.execute("INSERT INTO runs (run_id, world_size) VALUES ('empty', 1)")
        summary = decode_stored_run(con, "empty")
        assert (summary.ranks, summary.operators, summary.best_iteration) == (0, 0, None)
        assert con.execute("SELECT count(*) FROM operators").fetchall() == [(0,)]
        with pytest.raises(RunNotFoundError, match="not in the database"):
            decode_stored_run(con, "nope")

"""Golden tests: NCCL kernels sized and attributed from NCCL's own NVTX ranges (Nsight traces), as
the Nsight ingest stores them (``user_annotation`` named ``ncclAllReduce``/``ncclSend``/..., with
``coll_name`` and, from the typed payloads, ``bytes``, ``pg_name``, ``group_size`` and peers)."""

from __future__ import annotations

from typing import Any

import polars as pl
from decode_helpers import events, kernel, launch, step

from tracecal.decode.align import match_collectives
from tracecal.decode.rank import decode_rank
from tracecal.vocabulary import ParallelLayout

WORLD4 = ParallelLayout(world_size=4)
COLL = {"ncclAllReduce": "allreduce", "ncclAllGather": "allgather", "ncclSend": "send", "ncclRecv": "recv"}


def nvtx(name: str, ts: int, dur: int, **kw: Any) -> dict[str, Any]:
    return {"kind": "user_annotation", "category": "NVTX_EVENTS", "name": name, "ts": ts, "dur": dur,
            "coll_name": COLL.get(name), **kw}  # fmt: skip


def comm(**kw: Any) -> dict[str, Any]:
    return {"pg_name": "nccl_comm:7", "group_size": 4, **kw}


def test_an_ungrouped_call_sizes_and_names_the_kernel_it_launches() -> None:
    def rank_rows(rank: int) -> list[dict[str, Any]]:
        return [
            step(1, 0, 10_000),
            nvtx("nccl:all_reduce", 100, 400),  # PyTorch's annotation: no size
            nvtx("ncclAllReduce", 110, 100, bytes=4096, **comm()),  # the launch is inside it
            launch(1, 150),
            kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1, 300 + rank, 40),
            nvtx("ncclAllGather", 1_000, 100, bytes=1024, **comm()),  # one rank's shard
            launch(2, 1_050),
            kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 2, 1_200, 80),
        ]

    decoded = [decode_rank(events(rank_rows(r), rank=r), rank=r, layout=WORLD4) for r in range(4)]
    colls = match_collectives(pl.concat([d.collectives for d in decoded]))
    ar = colls.filter(pl.col("rank") == 0).sort("ts_ns").select("name", "size_bytes", "pg_name", "group_size")
    assert ar.rows() == [("all_reduce", 4096, "nccl_comm:7", 4), ("all_gather", 4096, "nccl_comm:7", 4)]
    assert colls.filter(pl.col("rank") == 0)["busbw_gbps"].to_list()[0] == 4096 / 40 * 2 * 3 / 4
    # one instance per collective, on all four ranks (grouped by the communicator)
    assert colls.group_by("match_id").len()["len"].to_list() == [4, 4]


def test_a_group_of_sends_and_receives_is_one_all_to_all_of_what_this_rank_sends() -> None:
    rows = [
        step(1, 0, 10_000),
        nvtx("nccl:all_to_all", 100, 900),
        nvtx("ncclGroupEnd", 105, 5),  # the capture began inside an earlier group: ignored
        nvtx("ncclGroupStart", 110, 5),
        *[nvtx(n, 120 + 10 * i, 5, bytes=512, **comm()) for i, n in enumerate(["ncclSend", "ncclRecv"] * 4)],
        nvtx("ncclGroupEnd", 300, 200),
        launch(1, 350),
        kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 1, 600, 100),
    ]
    c = decode_rank(events(rows), rank=0, layout=WORLD4).collectives.row(0, named=True)
    assert (c["name"], c["size_bytes"], c["pg_name"], c["group_size"], c["peer"]) == (
        "all_to_all",
        4 * 512,
        "nccl_comm:7",
        4,
        None,
    )


def test_a_grouped_send_takes_its_peer_and_nested_groups_launch_at_the_outermost_end() -> None:
    def rank_rows(rank: int) -> list[dict[str, Any]]:
        kind, peer = ("ncclSend", {"dst_rank": 1}) if rank == 0 else ("ncclRecv", {"src_rank": 0})
        return [
            step(1, 0, 10_000),
            nvtx("ncclGroupStart", 100, 5),
            nvtx("ncclGroupStart", 110, 5),  # nested (a coalescing manager inside a batch)
            nvtx(kind, 120, 5, bytes=2048, **comm(), **peer),
            nvtx("ncclGroupEnd", 130, 5),  # inner end: no launch
            nvtx("ncclGroupEnd", 200, 100),
            launch(1, 250),
            kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 1, 400, 64),
        ]

    decoded = [decode_rank(events(rank_rows(r), rank=r), rank=r, layout=ParallelLayout(world_size=2)) for r in (0, 1)]
    colls = match_collectives(pl.concat([d.collectives for d in decoded])).sort("rank")
    assert colls.select("rank", "name", "peer", "size_bytes").rows() == [(0, "send", 1, 2048), (1, "recv", 0, 2048)]
    assert colls["match_id"].n_unique() == 1 and colls["match_id"].null_count() == 0


def test_a_group_member_without_a_payload_leaves_the_size_unknown() -> None:
    rows = [
        step(1, 0, 10_000),
        nvtx("ncclGroupStart", 100, 5),
        nvtx("ncclSend", 110, 5, bytes=512, **comm()),
        nvtx("ncclSend", 120, 5),  # no payload recorded
        nvtx("ncclGroupEnd", 200, 100),
        launch(1, 250),
        kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 1, 400, 64),
    ]
    c = decode_rank(events(rows), rank=0, layout=WORLD4).collectives.row(0, named=True)
    assert (c["name"], c["size_bytes"], c["pg_name"]) == ("send", None, "nccl_comm:7")


def test_kernels_sharing_one_group_end_get_its_name_but_no_size() -> None:
    rows = [
        step(1, 0, 10_000),
        nvtx("ncclGroupStart", 100, 5),
        nvtx("ncclAllReduce", 110, 5, bytes=512, **comm()),
        nvtx("ncclAllReduce", 120, 5, bytes=256, **comm()),
        nvtx("ncclGroupEnd", 200, 100),
        launch(1, 250),
        launch(2, 260),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1, 400, 64),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 2, 500, 64),
    ]
    c = decode_rank(events(rows), rank=0, layout=WORLD4).collectives.sort("ts_ns")
    assert c.select("name", "size_bytes", "pg_name").rows() == [("all_reduce", None, "nccl_comm:7")] * 2

"""Collective message sizes: one convention (nccl-tests ``S``: an all-gather's gathered total) from the
collective call's signature, on decoded runs whose kernel tables pair a collective kernel with the
frame around its call, and on Kineto traces."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.conftest import GPUMODELING25, KINETO
from tracecal.ingest.input_dims import message_elements
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sources.gpumodeling25.rebuild.reconstruct import RunShape, _kernel_rows
from tracecal.sources.gpumodeling25.samples.ops import nccl_size_bytes
from tracecal.sql.connection import open_database

LLAMA = GPUMODELING25 / "runs" / "perlmutter" / "llama_13B_4_8_2_16_4"
ACTIVATION = [2048, 4, 5120]
"""The checkpointed layer input of LLaMA-13B (sequence x micro-batch x hidden), gathered over TP 8."""


def test_a_frame_states_an_all_reduce_but_not_an_all_gather() -> None:
    """The call states its input (an all-gather's shard); an operator around the call holds a tensor
    that is an all-reduce's message but may be an all-gather's shard or its gathered whole."""
    shard, whole = "[[5242880]]", "[[2048, 4, 5120], []]"
    assert message_elements("nccl:all_gather", shard, "all_gather") == 5242880
    assert message_elements("c10d::_allgather_base_", "[[41943040], [5242880], []]", "all_gather") == 5242880
    assert message_elements("CheckpointFunctionBackward", whole, "all_gather") is None
    assert message_elements("CheckpointFunctionBackward", whole, "allgather") is None
    assert message_elements("CheckpointFunctionBackward", whole, "reduce_scatter") is None
    assert message_elements("_ReduceFromModelParallelRegion", whole, "all_reduce") == 41943040
    assert message_elements("_ReduceFromModelParallelRegion", whole, "allreduce") == 41943040
    assert message_elements("CheckpointFunctionBackward", whole) is None  # the kind unknown: nothing


def _table(rows: list[tuple[int, str | None, str | None, str]]) -> pl.DataFrame:
    """A kernel table of (outer id, inner operator, its Input Dims, kernel) rows."""
    return pl.DataFrame(
        {
            "outer_op": ["autograd::engine::evaluate_function: CheckpointFunctionBackward"] * len(rows),
            "outer_id": [r[0] for r in rows],
            "outer_dims": [None] * len(rows),
            "inner_op": [r[1] for r in rows],
            "inner_id": list(range(len(rows))),
            "inner_dims": [r[2] for r in rows],
            "kernel": [r[3] for r in rows],
            "overhead_us": [1.0] * len(rows),
            "dur_us": [10.0] * len(rows),
        },
        schema_overrides={"outer_dims": pl.String, "inner_op": pl.String, "inner_dims": pl.String},
    )


def test_a_collective_kernel_takes_its_calls_message_from_the_same_occurrence() -> None:
    """As the published decoder pairs them: the all-gather kernel on the frame (or on a
    record_param_comms without dims), the call's range on the copies into its output list."""
    gather, copy = "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "Memcpy DtoD"
    reduce = "ncclKernel_AllReduce_RING_LL_Sum_half(ncclDevComm*, unsigned long, ncclWork*)"
    table = _table(
        [
            (1, "CheckpointFunctionBackward", "[[2048, 4, 5120], []]", gather),
            (1, "nccl:all_gather", "[[5242880]]", copy),
            (1, "CheckpointFunctionBackward", "[[2048, 4, 5120], []]", reduce),  # a frame states an all-reduce
            (2, "record_param_comms", "", gather),
            (2, "nccl:all_gather", "[[5242880]]", copy),
            (3, "CheckpointFunctionBackward", "[[2048, 4, 5120], []]", gather),  # no call in the occurrence
            (4, "record_param_comms", "", gather),  # two calls that disagree lend nothing
            (4, "nccl:all_gather", "[[5242880]]", copy),
            (4, "nccl:all_gather", "[[1024]]", copy),
        ]
    )
    shape = RunShape(pp=4, tp=8, dp=2, micro_batches=1, iterations_traced=1, layers_per_stage=[1] * 4, precision="fp16")
    rows = _kernel_rows(table, 1.0, shape).filter(pl.col("coll").is_not_null())
    assert rows.select("coll", "nelems").rows() == [
        ("allgather", 5242880),
        ("allreduce", 41943040),
        ("allgather", 5242880),
        ("allgather", None),
        ("allgather", None),
    ]


@pytest.mark.slow
def test_every_llama_stage_gathers_the_same_tensor_parallel_message(tmp_path: Path) -> None:
    """LLaMA-13B (PP4 x TP8 x DP2, activations partitioned over TP): the head's kernel table pairs the
    activation all-gathers with CheckpointFunctionBackward (the gathered whole), the tail's with
    record_param_comms (no dims), the middle's with the call. After ingest every stage gathers the
    same message: the 1/8 shard of the activation, stated as nccl-tests S (the gathered total), the
    size the NCCL sweep's row of that shard has."""
    path = tmp_path / "llama.duckdb"
    with open_database(path) as con:
        ingest_runs(con, [LLAMA], IngestOptions(cluster="perlmutter", workers=1))
    with open_database(Path(path), read_only=True) as con:
        sizes = con.execute(
            "SELECT rank, list(DISTINCT size_bytes), count(*) FILTER (WHERE size_bytes IS NULL) "
            "FROM collectives WHERE name = 'all_gather' AND role = 'tp' AND group_size = 8 GROUP BY rank ORDER BY rank"
        ).fetchall()
    shard = ACTIVATION[0] * ACTIVATION[1] * ACTIVATION[2] // 8
    total = nccl_size_bytes("all_gather", shard, 8)
    assert total == shard * 2 * 8
    assert sizes == [(rank, [total], 0) for rank in (0, 16, 32, 48)]


def test_kineto_all_gather_is_the_output_its_call_states(tmp_path: Path) -> None:
    """A Kineto ``c10d::_allgather_base_(output, input)`` of 2 of 128 ranks with no process group
    recorded: its ``nccl:`` range states the shard (16777216 bytes), the call the gathered output
    (1 GiB). The size is that output and the group output / shard (64), not the shard times the
    128 ranks of the job."""
    path = tmp_path / "k.duckdb"
    with open_database(path) as con:
        ingest_runs(con, [KINETO / "sampled_2_of_128"], IngestOptions(workers=1))
    with open_database(Path(path), read_only=True) as con:
        rows = con.execute(
            "SELECT DISTINCT size_bytes, group_size FROM collectives WHERE name = 'all_gather'"
        ).fetchall()
    assert rows == [(1073741824, 64)]

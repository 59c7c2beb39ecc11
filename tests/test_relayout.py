"""Layout what-if (docs/what-if.md) on the shared decoded GPT-NeoX runs: golden re-layouts (stages,
layers per stage, micro-batches, tensor-parallel shard shapes, collectives per stage), the identity
(a run re-laid out to its own layout replays the graph `tracecal predict` replays), and one clear line
per invalid layout."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracecal.api import Session
from tracecal.cli.main import app
from tracecal.predict.layouts import Layout, LayoutError, check_layout, parse_layout, partition, partition_rule
from tracecal.predict.relayout_run import predict_layout
from tracecal.predict.relayout_shapes import rewrite_dims, shape_map
from tracecal.predict.store import predict_stored_run
from tracecal.sources.gpumodeling25.read.decoded_run import read_decoded_run
from tracecal.sources.gpumodeling25.read.folder import decoded_job_dir
from tracecal.sources.gpumodeling25.read.neox_log import parse_neox_log
from tracecal.sources.gpumodeling25.rebuild.reconstruct import RunShape
from tracecal.sources.gpumodeling25.relayout import model_dims, model_facts, rebuild_at, relayout
from tracecal.sql.connection import open_database

RUNS = Path(__file__).resolve().parents[2] / "shared" / "data" / "gpumodeling25" / "runs" / "perlmutter"
GPT_448 = RUNS / "GPT_20B_4_4_8_32_4"
GPT_844 = RUNS / "GPT_20B_8_4_4_32_4"
LLEMMA = RUNS / "llemma_7B_4_2_2_4_4"


@pytest.fixture(scope="module")
def gpt_448():
    run = read_decoded_run(GPT_448)
    return run, parse_neox_log(run.log_path)


def test_partition_rule_reproduces_every_shared_listing() -> None:
    for folder in sorted(p for p in RUNS.iterdir() if p.is_dir()):
        log = parse_neox_log(next(decoded_job_dir(folder).glob("*.log")))
        rule = partition_rule(log.stage_layers)
        assert rule == "uniform", folder.name
        layers = [n for s in log.stage_layers for n in s]
        assert partition(layers, len(log.stage_layers), rule) == log.stage_layers


def test_pipeline_relayout_follows_the_listing_of_the_run_at_that_layout(gpt_448) -> None:
    """4·4·8 re-laid out to 8·4·4 gets the partition the 8·4·4 run's own log lists."""
    run, log = gpt_448
    plan = relayout(run, log, Layout(8, 4, 4))
    other = parse_neox_log(next(decoded_job_dir(GPT_844).glob("*.log")))
    assert plan.layers_per_stage == other.transformer_layers_per_stage == [5, 6, 6, 6, 6, 6, 6, 3]
    assert plan.log.stage_layers == other.stage_layers
    shape = RunShape.from_log(plan.log)
    assert (shape.pp, shape.tp, shape.dp, shape.micro_batches) == (8, 4, 4, 16)
    # the tables carry the layers of the stages they stand for
    from tracecal.sources.gpumodeling25.rebuild.reconstruct import layer_blocks

    assert len(layer_blocks(plan.run.tables["head"]["fwd"], "fwd")) == 5
    assert len(layer_blocks(plan.run.tables["middle"]["bwd"], "bwd")) == 6
    assert len(layer_blocks(plan.run.tables["tail"]["fwd"], "fwd")) == 3


def _dims_of(table: pl.DataFrame, op: str) -> list:
    return [json.loads(d) for d in table.filter(pl.col("inner_op") == op)["inner_dims"].unique(maintain_order=True)]


def test_tensor_parallel_shards_are_rederived(gpt_448) -> None:
    """TP 4 -> 8 halves the split dimension of every GEMM and the heads; the TP all-reduce message
    [l, b, h] is unchanged; micro-batches and sizes stay the source's."""
    run, log = gpt_448
    plan = relayout(run, log, Layout(4, 8, 4))
    fwd = plan.run.tables["middle"]["fwd"]
    assert [[2304], [8192, 6144], [6144, 2304], [], []] in _dims_of(fwd, "aten::addmm")  # QKV: n = 3h/8
    mm = _dims_of(fwd, "aten::mm")
    assert [[8192, 768], [768, 6144]] in mm  # attention output (row parallel): k = h/8
    assert [[8192, 6144], [6144, 3072]] in mm  # 4h/4 = h is ambiguous: exactly one of n, k split
    assert not any(d == [[8192, 6144], [6144, 6144]] for d in mm)
    assert _dims_of(fwd, "aten::baddbmm")[0][0] == [32, 2048, 2048]  # b·heads/8
    assert _dims_of(fwd, "nccl:all_reduce") == [[[2048, 4, 6144]]]
    assert plan.log.gradient_accumulation_steps == 16 and plan.log.train_micro_batch_size_per_gpu == 4


def test_micro_batch_size_changes_the_token_dimension(gpt_448) -> None:
    run, log = gpt_448
    dims = model_dims(log, run)
    m = shape_map(dims, dims.at(4, 2))
    assert rewrite_dims("aten::addmm", [[4608], [8192, 6144], [6144, 4608], [], []], m) == [
        [4608], [4096, 6144], [6144, 4608], [], [],
    ]  # fmt: skip
    assert rewrite_dims("aten::add", [[2048, 4, 6144], [2048, 4, 6144], []], m) == [[2048, 2, 6144]] * 2 + [[]]
    assert rewrite_dims("aten::baddbmm", [[64, 2048, 2048], [64, 2048, 96], [64, 96, 2048]], m)[0] == [32, 2048, 2048]


def test_data_parallel_buckets_and_zero_partition(gpt_448) -> None:
    """8·4·4 from 4·4·8: the head's gradients (half the layers) fit one bucket; the ZeRO partition is
    the stage's parameters over DP 4 — within 2 % of what the 8·4·4 run traced."""
    run, log = gpt_448
    plan = relayout(run, log, Layout(8, 4, 4))
    traced = read_decoded_run(GPT_844)

    def buckets(table: pl.DataFrame) -> list[int]:
        rows = table.filter(pl.col("inner_op") == "nccl:all_reduce")["inner_dims"].to_list()
        return [int(np.prod(json.loads(d)[0])) for d in rows if int(np.prod(json.loads(d)[0])) > 64]

    def gathers(table: pl.DataFrame) -> list[int]:
        rows = table.filter(pl.col("inner_op") == "nccl:_all_gather_base")["inner_dims"].to_list()
        return [json.loads(d)[0][0] for d in rows]

    for pos in ("head", "middle", "tail"):
        ours, theirs = buckets(plan.run.tables[pos]["reduce_grads"]), buckets(traced.tables[pos]["reduce_grads"])
        assert len(ours) == len(theirs) == 1, pos
        assert ours[0] == pytest.approx(theirs[0], rel=0.02), pos
        ours_g, theirs_g = (
            gathers(plan.run.tables[pos]["optimizer_step"]),
            gathers(traced.tables[pos]["optimizer_step"]),
        )
        assert ours_g[0] == pytest.approx(theirs_g[0], rel=0.02), pos


@pytest.mark.slow
def test_rebuilt_stages_collectives_and_groups() -> None:
    """Llemma 4·2·2 rebuilt at 2·4·2: two stages, TP all-reduces over 4 consecutive ranks, gradient
    all-reduces over DP ranks TP apart, one activation send per micro-batch from the head to the tail."""
    from tracecal.decode.consistency import misaligned_ops

    rebuilt, plan = rebuild_at(decoded_job_dir(LLEMMA), Layout(2, 4, 2), misaligned=misaligned_ops)
    assert [r.rank for r in rebuilt.ranks] == [0, 8]
    m = plan.log.gradient_accumulation_steps
    per_stage = []
    for r in rebuilt.ranks:
        ev = pl.from_arrow(r.events).filter(pl.col("coll_name").is_not_null())
        groups = Counter(
            (name, size, ranks) for name, size, ranks in ev.select("coll_name", "group_size", "pg_ranks").iter_rows()
        )
        per_stage.append(groups)
    tp0 = json.dumps([0, 1, 2, 3])
    assert any(k[0] == "allreduce" and k[1] == 4 and k[2] == tp0 for k in per_stage[0])
    assert any(k[0] == "allreduce" and k[1] == 2 and k[2] == json.dumps([0, 4]) for k in per_stage[0])
    sends = sum(v for k, v in per_stage[0].items() if k[0] == "send" and k[1] == 2)
    recvs = sum(v for k, v in per_stage[1].items() if k[0] == "recv" and k[1] == 2)
    assert sends == recvs and sends >= m
    # 37 layers uniformly: 19 (embedding, pre-block, 17 transformer) and 18 (15, post-block, norm, output)
    assert plan.layers_per_stage == [17, 15]


@pytest.fixture(scope="module")
def llemma_db(ingested_copy: Callable[..., Path]) -> Path:
    return ingested_copy(LLEMMA, cluster="perlmutter")


@pytest.mark.slow
def test_own_layout_replays_the_same_graph(llemma_db: Path, tmp_path: Path) -> None:
    with open_database(llemma_db) as con:
        _, today = predict_stored_run(con, "llemma_7B_4_2_2_4_4", mode="measured")
        same = predict_layout(
            con, "llemma_7B_4_2_2_4_4", Layout(4, 2, 2), scratch=Session(llemma_db).scratch_database, mode="measured"
        )
    a, b = today.graph, same.prediction.graph
    assert a.nodes.equals(b.nodes)
    for x, y in ((a.src, b.src), (a.dst, b.dst), (a.lag, b.lag), (a.edge_kind, b.edge_kind)):
        assert np.array_equal(x, y)
    assert same.iteration_ns == int(today.iteration_error()["predicted_ns"].max())


def test_the_scratch_database_is_the_sessions_and_leaves_nothing(tmp_path: Path) -> None:
    """`predict --layout` replays a rebuilt run in a database the API makes (``Session.scratch_database``):
    empty, with the schema, removed afterwards, and the session's own database untouched."""
    work = tmp_path / "work"
    work.mkdir()
    session = Session(tmp_path / "x.duckdb")
    with session.scratch_database(work) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        (folder,) = work.iterdir()
    assert not folder.exists() and not session.db_path.exists()


@pytest.mark.parametrize(
    ("layout", "gpus", "message"),
    [
        ("4x3x2", None, "32 attention heads are not divisible by tensor parallel 3"),
        ("64x1x1", None, "32 transformer layers cannot fill 64 pipeline stages"),
        ("4x2x2", 32, "uses 16 GPUs (PP·TP·DP), not the 32 asked for"),
        ("1x4x4", None, "2 or more pipeline stages"),
        ("4x2", None, "expected PPxTPxDP"),
    ],
)
def test_invalid_layouts_get_one_line(layout: str, gpus: int | None, message: str) -> None:
    log = parse_neox_log(next(decoded_job_dir(LLEMMA).glob("*.log")))
    facts = model_facts(log, model_dims(log))
    with pytest.raises(LayoutError) as err:
        check_layout(facts, Layout(*parse_layout(layout)), gpus=gpus, min_stages=2)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_cli_invalid_layout_is_one_line(llemma_db: Path) -> None:
    result = CliRunner().invoke(app, ["predict", "llemma_7B_4_2_2_4_4", "--layout", "4x3x2", "--db", str(llemma_db)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "not divisible by tensor parallel 3" in lines[0]


def test_search_needs_a_decoded_run_and_says_so(llemma_db: Path) -> None:
    result = CliRunner().invoke(
        app, ["search", "no_such_run", "--gpus", "16", "--mode", "measured", "--db", str(llemma_db)]
    )
    assert result.exit_code == 2 and "no run 'no_such_run'" in result.output


def test_layer_all_reduces_without_a_message_take_the_layers_message() -> None:
    """The 4·8·4 tail's backward records some tensor-parallel all-reduces without a message
    (``record_param_comms`` without dims): re-laid out, every all-reduce of a layer has one, so the
    communication model predicts it at the new group instead of keeping a two-node time."""
    from tracecal.sources.gpumodeling25.rebuild.reconstruct import layer_blocks

    run = read_decoded_run(RUNS / "GPT_20B_4_8_4_32_4")
    log = parse_neox_log(run.log_path)

    def unshaped(table: pl.DataFrame) -> int:
        flags = np.zeros(table.height, dtype=bool)
        for a, b in layer_blocks(table, "bwd"):
            flags[a:b] = True
        rows = table.filter(pl.Series(flags) & pl.col("kernel").str.contains("AllReduce"))
        return int((~rows["inner_dims"].str.contains(r"^\[\[\d").fill_null(False)).sum())

    assert unshaped(run.tables["tail"]["bwd"]) > 0
    plan = relayout(run, log, Layout(4, 4, 8))
    assert unshaped(plan.run.tables["tail"]["bwd"]) == 0


def test_search_candidates_of_16_gpus_for_the_llemma_model() -> None:
    """Every PP·TP·DP = 16 is a candidate; the ones the model cannot run are left out with their reason,
    and a device too small for a layout's estimated memory rules it out."""
    from tracecal.predict.search import candidates, valid_layouts

    run = read_decoded_run(LLEMMA)
    log = parse_neox_log(run.log_path)
    dims = model_dims(log, run)
    facts = model_facts(log, dims)
    layers = [n for s in log.stage_layers for n in s]

    def first(layout: Layout) -> int:
        counts = [sum("TransformerLayer" in n for n in s) for s in partition(layers, layout.pp, "uniform")]
        if min(counts) < 1:
            raise LayoutError(f"layout {layout.text}: a stage without a transformer layer")
        return counts[0]

    base = Layout(4, 2, 2, micro_batches=16, micro_batch_size=4, gpus_per_node=4)
    assert len(candidates(16)) == 15
    kept, rejected = valid_layouts(16, facts, dims, base, stage_layers=first, memory_bytes=None)
    assert {k.text for k in kept} >= {"4x2x2", "2x4x2", "8x2x1", "2x1x8"}
    assert all(k.pp >= 2 and k.world_size == 16 for k in kept)
    assert {r.layout.text for r in rejected} >= {"1x16x1", "16x1x1"}
    assert len(kept) + len(rejected) == 15
    small, _ = valid_layouts(16, facts, dims, base, stage_layers=first, memory_bytes=8e9)
    assert len(small) < len(kept) and all(k.tp >= 2 for k in small)


@given(st.text(max_size=24))
def test_parse_layout_takes_three_positive_integers_or_says_what_it_expects(text: str) -> None:
    try:
        pp, tp, dp = parse_layout(text)
    except LayoutError as exc:
        assert "expected PPxTPxDP" in str(exc) and "\n" not in str(exc)
    else:
        assert min(pp, tp, dp) >= 1


@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64))
def test_parse_layout_round_trips(pp: int, tp: int, dp: int) -> None:
    assert parse_layout(Layout(pp, tp, dp).text) == (pp, tp, dp)

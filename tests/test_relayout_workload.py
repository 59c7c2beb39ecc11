"""`tracecal predict RUN --layout` for runs of the reference workload: the schedule it follows, golden
re-layouts of a traced PP1 run, the identity, and invalid layouts (docs/what-if.md)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from tracecal.predict.layouts import Layout, LayoutError
from tracecal.predict.relayout_workload import rebuild_workload_at, target_config
from tracecal.workload import WorkloadConfig
from tracecal.workload.parameters import gradient_buckets, stage_parameters
from tracecal.workload.pipeline_order import (
    BACKWARD,
    COMMUNICATE,
    FORWARD,
    RECV_ACTIVATIONS,
    RECV_GRADS,
    SEND_ACTIVATIONS,
    SEND_GRADS,
    stage_instructions,
)

SCOPES = (FORWARD, BACKWARD, SEND_ACTIVATIONS, RECV_ACTIVATIONS, SEND_GRADS, RECV_GRADS)


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _step(events: list[dict]) -> tuple[dict, list[dict]]:
    step = min((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    inside = [e for e in events if step["ts"] <= e["ts"] < step["ts"] + step["dur"] and e is not step]
    return step, sorted(inside, key=lambda e: (e["ts"], -e["dur"]))


def test_pipeline_order_is_the_traced_one(tiny_workload) -> None:
    """The pure 1F1B order is the order the workload's ranks ran their scopes in."""
    run = tiny_workload(2, 64)
    cfg = WorkloadConfig.from_dict(json.loads((run / "run.json").read_text())["config"])
    for stage in range(cfg.pp):
        _, inside = _step(_events(run / f"rank{cfg.rank_of(stage, 0, 0)}.pt.trace.json.gz"))
        traced = [e["name"] for e in inside if e["name"] in SCOPES]
        expected = []
        for ins in stage_instructions(cfg.pp, stage, cfg.micro_batches):
            expected += list(ins.posts) if ins.kind == COMMUNICATE else [ins.kind]
        assert traced == expected


def test_parameters_and_buckets_follow_the_workload() -> None:
    cfg = WorkloadConfig(pp=2, tp=2, layers=2, hidden=64, heads=4)
    first, last = stage_parameters(cfg, 0), stage_parameters(cfg, 1)
    assert first[0] == ("pos.weight", (cfg.seq, 64)) and ("embed.weight", (cfg.vocab, 64)) in first
    assert ("head.weight", (cfg.vocab, 64)) in last and not any(n.startswith("embed") for n, _ in last)
    assert dict(first)["blocks.0.qkv.weight"] == (96, 64)  # 3h / TP rows
    assert dict(last)["blocks.1.mlp_out.weight"] == (64, 128)  # 4h / TP columns
    shapes = [s for _, s in first]
    buckets = gradient_buckets(shapes, 32 * 1024)
    assert sorted(i for b in buckets for i in b) == list(range(len(shapes)))
    assert buckets[0][0] == len(shapes) - 1  # reverse parameter order


@pytest.mark.slow
def test_golden_relayouts_of_a_pp1_run(tiny_workload, tmp_path: Path) -> None:
    """PP1 rebuilt at PP2, TP2 and DP2: stages, layers per stage, TP shard shapes and the collectives
    of every rank, read back from the rank traces written."""
    run = tiny_workload(1, 128)  # hidden 128, 4 heads, seq 32, 2 layers, 4 micro-batches of 2
    m, layers = 4, 2

    def rebuilt(layout: tuple[int, int, int]) -> dict[int, Counter]:
        out = tmp_path / "x".join(map(str, layout))
        plan = rebuild_workload_at(run, Layout(*layout), out)
        assert plan.layers_per_stage == [layers // layout[0]] * layout[0]
        meta = json.loads((out / "run.json").read_text())
        assert (meta["pp"], meta["tp"], meta["dp"]) == layout
        ranks = {}
        for r in range(meta["world_size"]):
            _, inside = _step(_events(out / f"rank{r}.pt.trace.json.gz"))
            ranks[r] = Counter(e["name"] for e in inside)
            ranks[r]["linear dims"] = {
                json.dumps(e["args"]["Input Dims"]) for e in inside if e["name"] == "aten::linear"
            }
        return ranks

    pp2 = rebuilt((2, 1, 1))
    for r, names in pp2.items():
        assert names["## forward ##"] == names["## backward ##"] == m
        assert names["aten::layer_norm"] == m * (2 + int(r == 1))  # one layer each; the final norm on the last
        assert names["gloo:send"] == names["gloo:recv"] == m
        assert names["gloo:all_reduce"] == 0
        assert names["aten::embedding"] == (m if r == 0 else 0)
    tp2 = rebuilt((1, 2, 1))
    for names in tp2.values():
        assert names["gloo:all_reduce"] == 4 * layers * m  # 2 forward, 2 backward per layer and micro-batch
        assert names["gloo:send"] == 0
        # column-parallel QKV [3h/2, h], row-parallel out-projection [h, h/2], MLP [4h/2, h] and [h, 4h/2];
        # the LM head stays whole (the vocabulary is not split)
        assert {'[[2, 32, 128], [192, 128], [192]]', '[[2, 32, 64], [128, 64], []]',
                '[[2, 32, 128], [256, 128], [256]]', '[[2, 32, 256], [128, 256], []]',
                '[[2, 32, 128], [256, 128], []]'} <= names["linear dims"]  # fmt: skip
    dp2 = rebuilt((1, 1, 2))
    cfg = WorkloadConfig.from_dict(json.loads((run / "run.json").read_text())["config"])
    buckets = gradient_buckets([s for _, s in stage_parameters(cfg, 0)], cfg.bucket_bytes)
    for names in dp2.values():
        assert names["_exec_reduce_grads"] == 1 and names["gloo:all_reduce"] == len(buckets)
        assert names["aten::layer_norm"] == m * (2 * layers + 1)


def test_invalid_layouts_get_one_line() -> None:
    cfg = WorkloadConfig(pp=1, layers=4, hidden=64, heads=4)
    cases = {
        Layout(1, 3, 1): "attention heads are not divisible by tensor parallel 3",
        Layout(3, 1, 1): "--layers 4 is not divisible by --pp 3",
        Layout(8, 1, 1): "4 transformer layers cannot fill 8 pipeline stages",
    }
    for layout, words in cases.items():
        with pytest.raises(LayoutError) as err:
            target_config(cfg, layout)
        assert words in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(LayoutError, match=r"uses 2 GPUs .* not the 4 asked for"):
        target_config(cfg, Layout(2, 1, 1), gpus=4)


@pytest.mark.slow
def test_predict_layout_cli_and_identity(tiny_workload, tmp_path: Path, template_cache: Path) -> None:
    """The command end to end on a traced run; its own layout replays today's graph."""
    from typer.testing import CliRunner

    from tracecal.api import Session
    from tracecal.cli.main import app
    from tracecal.pipeline.ingest import IngestOptions, ingest_runs
    from tracecal.predict.relayout_run import predict_layout
    from tracecal.predict.store import predict_stored_run
    from tracecal.sql.connection import open_database

    run = tiny_workload(1, 64)
    db = tmp_path / "w.duckdb"
    with open_database(db, cache_dir=template_cache) as con:
        ingest_runs(con, [run], IngestOptions(workers=1))
        own = predict_layout(con, run.name, Layout(1, 1, 1), scratch=Session(db).scratch_database, mode="measured")
        _, today = predict_stored_run(con, run.name, mode="measured", compare=False)
    assert own.prediction.graph.nodes.height == today.graph.nodes.height
    assert own.prediction.graph.nodes["name"].to_list() == today.graph.nodes["name"].to_list()
    out = CliRunner().invoke(app, ["predict", run.name, "--layout", "2x1x1", "--mode", "measured", "--db", str(db)])
    assert out.exit_code == 0, out.output
    assert "at 2x1x1" in out.output and "layers per stage [1, 1]" in out.output
    bad = CliRunner().invoke(app, ["predict", run.name, "--layout", "1x3x1", "--mode", "measured", "--db", str(db)])
    assert bad.exit_code != 0 and "not divisible by tensor parallel 3" in bad.output
    assert "Traceback" not in bad.output

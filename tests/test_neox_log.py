"""GPT-NeoX logs -> NeoxLog, Table 8 from them, the module-time tables, and `tracecal iterations` on a
decoded run's metadata (the shared GPUModeling25 runs plus small logs written here)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import GPUMODELING25
from tracecal.cli.main import app
from tracecal.errors import InputNotFoundError, TraceFormatError
from tracecal.sources.gpumodeling25.read.neox_log import (
    NeoxLog,
    iteration_statistics,
    parse_neox_log,
    parse_neox_log_text,
)
from tracecal.sources.gpumodeling25.read.tables import (
    read_module_times,
    table8_from_metadata,
    train_batch_us,
)
from tracecal.sql.connection import open_database

RUNS = GPUMODELING25 / "runs" / "perlmutter"
PUBLISHED = GPUMODELING25 / "published" / "iteration_statistics.csv"
JOBS = sorted(p for p in RUNS.glob("*/*/") if any(p.glob("*.log")))
TOLERANCE_S = 0.05

pytestmark = pytest.mark.skipif(not JOBS, reason="shared GPUModeling25 runs not present")
runner = CliRunner()

# (pp, tp, dp, layers, hidden, heads, seq, mbs, gas, profile start, stop, transformer layers per stage, reduce bucket)
EXPECTED = {
    "GPT_20B_4_4_8_32_4": (4, 4, 8, 44, 6144, 64, 2048, 4, 16, 2, 7, [11, 12, 12, 9], 1_260_000_000),
    "GPT_20B_4_8_4_32_4": (4, 8, 4, 44, 6144, 64, 2048, 4, 16, 2, 7, [11, 12, 12, 9], 1_260_000_000),
    "GPT_20B_8_4_4_32_4": (8, 4, 4, 44, 6144, 64, 2048, 4, 16, 2, 7, [5, 6, 6, 6, 6, 6, 6, 3], 1_260_000_000),
    "llama_13B_4_8_2_16_4": (4, 8, 2, 40, 5120, 40, 2048, 4, 16, 2, 7, [10, 11, 11, 8], 500_000_000),
    "llemma_7B_4_2_2_4_4": (4, 2, 2, 32, 4096, 32, 4096, 4, 8, 2, 11, [8, 9, 9, 6], 1_260_000_000),
}


def _log_of(job: Path) -> Path:
    return next(job.glob("*.log"))


def _published() -> dict[str, dict[str, float]]:
    with PUBLISHED.open() as handle:
        return {row["model"]: {k: float(v) for k, v in row.items() if k != "model"} for row in csv.DictReader(handle)}


def _module_times(job: Path) -> dict[str, dict[str, list[float]]]:
    return {t: read_module_times(job / f"module_times_{t}.csv") for t in ("average", "min")}


@pytest.mark.parametrize("job", JOBS, ids=lambda p: p.parent.name)
def test_every_shared_log_parses_to_its_layout(job: Path) -> None:
    log = parse_neox_log(_log_of(job))
    pp, tp, dp, layers, hidden, heads, seq, mbs, gas, start, stop, per_stage, bucket = EXPECTED[job.parent.name]
    assert (log.pipe_parallel_size, log.model_parallel_size, log.data_parallel_size) == (pp, tp, dp)
    assert log.world_size == pp * tp * dp == log.nodes * log.gpus_per_node
    assert log.gpus_per_node == 4
    assert int(log.deepspeed_config["world_size"]) == dp  # DeepSpeed prints its data-parallel size
    assert (log.num_layers, log.hidden_size, log.num_attention_heads, log.seq_length) == (layers, hidden, heads, seq)
    assert (log.train_micro_batch_size_per_gpu, log.gradient_accumulation_steps) == (mbs, gas)
    assert (log.profile_step_start, log.profile_step_stop) == (start, stop)
    assert log.profiled_iterations == list(range(start + 1, stop + 1))
    assert log.precision == "fp16" and log.checkpoint_activations is True and log.zero_stage == 1
    assert log.reduce_bucket_size == log.allgather_bucket_size == bucket
    assert log.deepspeed_version == "0.12.4+02e2ebf"
    assert len(log.stage_layers) == pp
    assert log.transformer_layers_per_stage == per_stage and sum(per_stage) == layers
    assert log.stage_layers[0][0] == "EmbeddingPipe" and log.stage_layers[-1][-1] == "ParallelLinearPipe"
    assert len(log.args) > 250 and log.args["prompt_end"] == "\n"  # a value printed over two lines
    its = [it for it, _ in log.iteration_ms]
    assert its == list(range(1, len(its) + 1))
    assert all(ms > 0 for _, ms in log.iteration_ms)


def test_golden_values_of_one_log() -> None:
    log = parse_neox_log(_log_of(RUNS / "GPT_20B_4_4_8_32_4" / "31694544"))
    assert log.iteration_ms[:3] == [(1, 39201.3), (2, 17444.8), (3, 17410.9)]
    assert [len(stage) for stage in log.stage_layers] == [13, 12, 12, 12]
    assert log.stage_layers[0][:3] == ["EmbeddingPipe", "_pre_transformer_block", "ParallelTransformerLayerPipe"]
    assert log.stage_layers[3][-3:] == ["_post_transformer_block", "NormPipe", "ParallelLinearPipe"]
    assert log.args["lr"] == "9.7e-05" and log.args["split"] == "995,4,1"
    first = log.step_timers_ms[0]
    assert first[0] == 1 and first[1]["optimizer_allgather"] == 1998.36 and first[1]["pipe_recv_grad"] == 12981.28


def test_a_log_missing_what_a_rebuild_needs_is_named() -> None:
    """The schedule's rebuild and the re-layout's shapes each name the values the log leaves out."""
    from dataclasses import replace

    from tracecal.errors import PredictionError
    from tracecal.sources.gpumodeling25.rebuild.reconstruct import RunShape
    from tracecal.sources.gpumodeling25.relayout import model_dims

    log = parse_neox_log(_log_of(RUNS / "llemma_7B_4_2_2_4_4" / "31664313"))
    cut = replace(log, seq_length=None, gradient_accumulation_steps=None)
    assert cut.unstated("hidden_size", "seq_length", "gradient_accumulation_steps") == [
        "seq_length", "gradient_accumulation_steps"
    ]  # fmt: skip
    with pytest.raises(PredictionError, match="states no seq_length; cannot re-derive shapes"):
        model_dims(cut)
    with pytest.raises(TraceFormatError, match="states no gradient_accumulation_steps; cannot rebuild the schedule"):
        RunShape.from_log(cut)


@pytest.mark.parametrize("job", JOBS, ids=lambda p: p.parent.name)
def test_json_round_trip(job: Path) -> None:
    log = parse_neox_log(_log_of(job))
    stored = json.loads(json.dumps(log.to_json()))
    assert NeoxLog.from_json(stored) == log


def test_the_log_without_iteration_lines() -> None:
    log = parse_neox_log(_log_of(RUNS / "llemma_7B_4_2_2_4_4" / "31664313"))
    assert log.iteration_ms == []
    assert iteration_statistics(log)["missing"] == ["min_s", "max_s", "mean_s", "std_s", "mean_vs_min_pct"]


@pytest.mark.parametrize("job", JOBS, ids=lambda p: p.parent.name)
def test_table8_matches_the_published_row(job: Path) -> None:
    published = _published()[job.parent.name + "_P"]
    t8 = iteration_statistics(parse_neox_log(_log_of(job)), train_batch_us(_module_times(job)))
    for ours, theirs in (("min_s", "min"), ("max_s", "max"), ("mean_s", "average"), ("std_s", "std")):
        if ours in t8["missing"]:
            continue
        assert abs(t8[ours] - published[theirs]) <= TOLERANCE_S, (ours, t8[ours], published[theirs])
    assert t8["min_s"] is not None and t8["mean_s"] is not None


def test_table8_from_module_times_only_has_mean_and_min() -> None:
    job = RUNS / "llemma_7B_4_2_2_4_4" / "31664313"
    t8 = iteration_statistics(parse_neox_log(_log_of(job)), train_batch_us(_module_times(job)))
    assert t8["missing"] == ["max_s", "std_s"]
    assert round(t8["min_s"], 2) == 9.57 and round(t8["mean_s"], 2) == 9.59
    assert round(t8["mean_vs_min_pct"], 4) == 0.1664  # published: 0.1664
    assert t8["source"]["min_s"].startswith("module_times_min.csv")
    assert t8["iterations"] == list(range(3, 12))


def test_table8_by_hand() -> None:
    """Five profiled iterations of 2, 4, 4, 4, 6 s: min 2, max 6, mean 4, population std sqrt(1.6)."""
    log = _tiny_log(profile=(1, 6), iteration_ms=[999.0, 2000.0, 4000.0, 4000.0, 4000.0, 6000.0, 999.0])
    t8 = iteration_statistics(log, {"average": [1e9], "min": [1e9]})
    assert t8["iterations"] == [2, 3, 4, 5, 6]
    assert (t8["min_s"], t8["max_s"], t8["mean_s"]) == (2.0, 6.0, 4.0)
    assert t8["std_s"] == pytest.approx(1.6**0.5)
    assert t8["mean_vs_min_pct"] == pytest.approx(100.0)
    assert t8["missing"] == [] and t8["source"]["max_s"].startswith("log:")


def test_zero_module_times_mean_not_found() -> None:
    t8 = iteration_statistics(None, {"average": [2e6, 0.0, 4e6], "min": [0.0, 1e6]})
    assert (t8["min_s"], t8["mean_s"], t8["mean_vs_min_pct"]) == (1.0, 3.0, 200.0)


def test_read_module_times(tmp_path: Path) -> None:
    path = tmp_path / "module_times_min.csv"
    path.write_text(
        "module,function,gpu_runtime(us)\n"
        'encoder_fwd,f,"[1.5, 2, 0]"\n'
        'update,deepspeed/runtime/pipe/engine.py(312): train_batch,"[10, 20, 30]"\n'
        'encoder_fwd,f,"[9, 9, 9]"\n'
    )
    times = read_module_times(path)
    assert times == {"encoder_fwd": [1.5, 2.0, 0.0], "update": [10.0, 20.0, 30.0]}
    assert train_batch_us({"min": times}) == {"min": [10.0, 20.0, 30.0]}
    path.write_text('module,function,gpu_runtime(us)\nencoder_fwd,f,"[1.5, oops]"\n')
    with pytest.raises(TraceFormatError, match=r"module_times_min.csv:2: .* not a list of numbers"):
        read_module_times(path)


def test_train_batch_row_beats_update_in_average_tables() -> None:
    job = RUNS / "GPT_20B_4_4_8_32_4" / "31694544"
    picked = train_batch_us(_module_times(job))
    assert picked["average"] == [17427065.8, 17433200.0, 17434098.8]
    assert picked["min"] == [17371745.0, 17348904.0, 17370275.0]


def test_log_without_argument_dump_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("nid1: samples/sec: 1.0 | iteration        1/       8 | elapsed time per iteration (ms): 5.0 |\n")
    with pytest.raises(TraceFormatError) as info:
        parse_neox_log(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "argument dump" in message
    with pytest.raises(InputNotFoundError, match="no GPT-NeoX log at"):
        parse_neox_log(tmp_path / "absent.log")
    truncated = "-------------------- arguments --------------------\n  lr .... 0.1........updated\n"
    with pytest.raises(TraceFormatError, match="truncated"):
        parse_neox_log_text(truncated, source="t.log")


def test_host_prefixes_and_other_ranks_lines() -> None:
    """Only the rank-0 host's iteration lines count; a second rank's copy of the listing is ignored."""
    log = _tiny_log(profile=(0, 2), iteration_ms=[100.0, 200.0], host="h0")
    text = _tiny_text(profile=(0, 2), iteration_ms=[100.0, 200.0], host="h0")
    text += "h1:  samples/sec: 1 | iteration        1/       2 | elapsed time per iteration (ms): 9999.0 |\n"
    text += "h1: stage=0 layers=1\nh1:     0: Other\n"
    again = parse_neox_log_text(text)
    assert again.iteration_ms == log.iteration_ms == [(1, 100.0), (2, 200.0)]
    assert again.stage_layers == [["EmbeddingPipe", "ParallelTransformerLayerPipe"], ["ParallelTransformerLayerPipe"]]
    assert (again.nodes, again.gpus_per_node, again.world_size, again.data_parallel_size) == (2, 2, 4, 2)


def _tiny_text(profile: tuple[int, int], iteration_ms: list[float], host: str = "h0") -> str:
    start, stop = profile
    args = {
        "pipe_parallel_size": "2",
        "model_parallel_size": "1",
        "num_layers": "2",
        "profile_step_start": str(start),
        "profile_step_stop": str(stop),
        "precision": "bf16",
    }
    lines = ["-------------------- arguments --------------------"]
    for name, value in args.items():
        head = f"  {name} {'.' * (32 - len(name))} {value}"
        lines.append(head + "." * (64 - len(head)) + "updated")
    lines.append("---------------- end of arguments ----------------")
    lines.append(
        f"{host}: [2024-01-01 00:00:00,000] [INFO] [launch.py:151:main] nnodes=2, num_local_procs=2, node_rank=0"
    )
    lines.append("h1: [2024-01-01 00:00:00,000] [INFO] [launch.py:151:main] nnodes=2, num_local_procs=2, node_rank=1")
    lines.append(f"{host}: [2024-01-01 00:00:00,000] [INFO] [launch.py:163:main] dist_world_size=4")
    lines += [
        f"{host}: stage=0 layers=2",
        f"{host}:     0: EmbeddingPipe",
        f"{host}:     1: ParallelTransformerLayerPipe",
    ]
    lines += [f"{host}: stage=1 layers=1", f"{host}:     2: ParallelTransformerLayerPipe", f"{host}:   loss: partial"]
    for it, ms in enumerate(iteration_ms, start=1):
        counter = f"iteration {it:8d}/{len(iteration_ms):8d}"
        lines.append(f"{host}:  samples/sec: 1.0 | {counter} | elapsed time per iteration (ms): {ms} |")
    return "\n".join(lines) + "\n"


def _tiny_log(profile: tuple[int, int], iteration_ms: list[float], host: str = "h0") -> NeoxLog:
    return parse_neox_log_text(_tiny_text(profile, iteration_ms, host), source="tiny.log")


def _insert_run(db_path: Path, run_id: str, metadata: dict | None) -> None:
    with open_database(db_path) as con:
        con.execute(
            "INSERT INTO runs (run_id, name, format, metadata_json) VALUES (?, ?, 'kineto', ?)",
            [run_id, run_id, None if metadata is None else json.dumps(metadata)],
        )


def test_cli_prints_table8_from_the_stored_log(db_path: Path) -> None:
    job = RUNS / "GPT_20B_4_4_8_32_4" / "31694544"
    log = parse_neox_log(_log_of(job))
    _insert_run(db_path, "r1", {"neox_log": log.to_json(), "run_level_module_times": _module_times(job)})
    result = runner.invoke(app, ["iterations", "r1", "--db", str(db_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Table 8" in result.output
    row = next(line for line in result.output.splitlines() if "5 (3-7)" in line)
    assert all(v in row for v in ("17.37", "17.55", "17.43", "0.06", "0.3259")), row
    assert "profiled iterations 3-7" in result.output
    assert "no decoded iterations" not in result.output


def test_cli_says_what_is_missing(db_path: Path) -> None:
    job = RUNS / "llemma_7B_4_2_2_4_4" / "31664313"
    log = parse_neox_log(_log_of(job))
    assert table8_from_metadata({"neox_log": log.to_json()})["missing"][0] == "min_s"
    _insert_run(db_path, "r2", {"neox_log": log.to_json(), "run_level_module_times": _module_times(job)})
    result = runner.invoke(app, ["iterations", "r2", "--db", str(db_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "9 (3-11)" in line)
    assert "9.57" in row and "9.59" in row and "0.1664" in row, row
    assert "lacks max_s, std_s" in result.output
    assert "module_times_average.csv" in result.output


def test_cli_keeps_the_trace_output_without_a_log(db_path: Path) -> None:
    _insert_run(db_path, "r3", None)
    result = runner.invoke(app, ["iterations", "r3", "--db", str(db_path)])
    assert result.exit_code == 0, result.output
    assert "no decoded iterations" in result.output and "Table 8" not in result.output


def test_cli_bad_stored_log_is_one_clear_line(db_path: Path) -> None:
    _insert_run(db_path, "r4", {"neox_log": {"version": 0}})
    result = runner.invoke(app, ["iterations", "r4", "--db", str(db_path)])
    assert result.exit_code == 2
    assert "re-ingest the run" in result.output

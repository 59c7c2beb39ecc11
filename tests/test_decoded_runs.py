"""Decoded GPT-NeoX runs: the 1F1B schedule, the rebuilt iteration of the smallest published run
(Llemma-7B, 16 A100s, PP4 x TP2 x DP2), its replay and validation, and bad run folders."""

from __future__ import annotations

import csv
import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import GPUMODELING25
from tracecal.cli.main import app
from tracecal.errors import InputNotFoundError, PredictionError, TraceFormatError
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sources.gpumodeling25.read.neox_log import parse_neox_log
from tracecal.sources.gpumodeling25.rebuild.pipeline_schedule import stage_instructions
from tracecal.sources.gpumodeling25.validate.published import CSV_COLUMNS
from tracecal.sources.gpumodeling25.validate.published_runs import validate_decoded_run
from tracecal.sql.connection import open_database

RUNS = GPUMODELING25 / "runs" / "perlmutter"
LLEMMA = RUNS / "llemma_7B_4_2_2_4_4"
runner = CliRunner()


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 1), (4, 8), (8, 16), (3, 2)])
def test_schedule_is_one_forward_one_backward(stages: int, micro_batches: int) -> None:
    for stage in range(stages):
        kinds = [(i.kind, i.micro_batch) for i in stage_instructions(stage, stages, micro_batches)]
        fwd = [mb for k, mb in kinds if k == "forward"]
        bwd = [mb for k, mb in kinds if k == "backward"]
        assert fwd == bwd == list(range(micro_batches))
        # warm-up: the stage runs (stages - stage - 1) forwards, capped by the micro-batches, before its first backward
        first_bwd = next(i for i, (k, _) in enumerate(kinds) if k == "backward")
        assert sum(k == "forward" for k, _ in kinds[:first_bwd]) == min(stages - stage, micro_batches)
        # every micro-batch's forward precedes its backward, and activations arrive before the forward
        for mb in range(micro_batches):
            assert kinds.index(("forward", mb)) < kinds.index(("backward", mb))
            if stage > 0:
                assert kinds.index(("recv_activation", mb)) < kinds.index(("forward", mb))
            if stage < stages - 1:
                assert kinds.index(("recv_grad", mb)) < kinds.index(("backward", mb))
        counts = Counter(k for k, _ in kinds)
        assert counts["send_activation"] == (0 if stage == stages - 1 else micro_batches)
        assert counts["recv_activation"] == (0 if stage == 0 else micro_batches)
        assert counts["send_grad"] == (0 if stage == 0 else micro_batches)
        assert kinds[-3:] == [("reduce_grads", None), ("optimizer_step", None), ("aggregate_loss", None)]


@pytest.fixture(scope="module")
def llemma_db(ingested_copy: Callable[..., Path]) -> Path:
    """The Llemma run ingested for perlmutter (its format, read from the runs table: test_layout_comes_from_the_log)."""
    return ingested_copy(LLEMMA, cluster="perlmutter")


def test_layout_comes_from_the_log(llemma_db: Path) -> None:
    log = parse_neox_log(next((LLEMMA / "31664313").glob("*.log")))
    with open_database(Path(llemma_db), read_only=True) as con:
        row = con.execute("SELECT format, pp, tp, dp, world_size, layout_source FROM runs").fetchone()
        ranks = [r[0] for r in con.execute("SELECT rank FROM ranks ORDER BY rank").fetchall()]
    assert row == ("gpumodeling25", log.pipe_parallel_size, log.model_parallel_size, log.data_parallel_size, 16, "log")
    # one rank per stage: the first tensor- and data-parallel rank (DeepSpeed orders pipe, data, model)
    assert ranks == [s * log.data_parallel_size * log.model_parallel_size for s in range(log.pipe_parallel_size)]


def test_rebuilt_iteration_against_the_log(llemma_db: Path) -> None:
    log = parse_neox_log(next((LLEMMA / "31664313").glob("*.log")))
    m = log.gradient_accumulation_steps
    with open_database(Path(llemma_db), read_only=True) as con:
        forwards = dict(
            con.execute(
                "SELECT rank, count(*) FROM events WHERE name LIKE '%pipe/module.py: forward' GROUP BY 1"
            ).fetchall()
        )
        layers = dict(
            con.execute(
                "SELECT rank, count(*) FROM events WHERE name LIKE '%checkpointing.py: forward' GROUP BY 1"
            ).fetchall()
        )
        p2p = con.execute(
            "SELECT name, rank, peer, count(*), count(match_id) FROM collectives WHERE name IN ('send', 'recv') "
            "GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        mp = con.execute(
            "SELECT match_id, count(DISTINCT rank) FROM collectives WHERE pg_name = 'mp-0' "
            "AND match_id IS NOT NULL GROUP BY 1"
        ).fetchall()
        dp = dict(con.execute("SELECT rank, count(*) FROM collectives WHERE role = 'dp' GROUP BY 1").fetchall())
    ranks = sorted(forwards)
    assert all(forwards[r] == m for r in ranks)  # one stage forward per micro-batch
    per_stage = log.transformer_layers_per_stage
    assert [layers[r] for r in ranks] == [m * n for n in per_stage]
    # sends and receives only between neighbouring stages, every one matched
    for name, rank, peer, count, matched in p2p:
        assert abs(ranks.index(rank) - ranks.index(peer)) == 1, (name, rank, peer)
        assert matched == count
    # the optimizer's model-parallel reductions join every stage; each stage reduces its gradients
    assert mp and all(n == len(ranks) for _, n in mp)
    assert all(dp.get(r, 0) > 0 for r in ranks)


def test_measured_replay_within_3_percent_of_train_batch(llemma_db: Path) -> None:
    with open_database(llemma_db) as con:
        result = validate_decoded_run(con, "llemma_7B_4_2_2_4_4", mode="measured")
    overall = result.components.filter(result.components["component"] == "Overall").row(0, named=True)
    assert abs(overall["error_pct"]) < 3.0
    assert overall["measured_ms"] == pytest.approx(9575.284)
    stage_fwd = result.components.filter(result.components["component"] == "stage_fwd_max").row(0, named=True)
    assert abs(stage_fwd["error_pct"]) < 3.0


def test_validate_csv_has_the_published_columns(llemma_db: Path) -> None:
    out = runner.invoke(app, ["validate", "--mode", "measured", "--format", "csv", "--db", str(llemma_db)])
    assert out.exit_code == 0, out.output
    lines = out.stdout.strip().splitlines()  # the CSV; progress lines go to stderr
    assert tuple(lines[0].split(",")) == CSV_COLUMNS
    assert len(lines) == 11  # ten published components of one run


def test_table8_from_the_stored_log(llemma_db: Path) -> None:
    out = runner.invoke(app, ["iterations", "llemma_7B_4_2_2_4_4", "--db", str(llemma_db)])
    assert out.exit_code == 0, out.output
    assert "9.57" in out.output  # published Table 8 min (the log has no per-iteration lines: module times)


def _copy_run(tmp_path: Path) -> Path:
    dst = tmp_path / LLEMMA.name
    shutil.copytree(LLEMMA, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def test_a_missing_rank_table_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    run = _copy_run(tmp_path)
    (run / "31664313" / "1" / "bwd.csv").unlink()
    db = tmp_path / "bad.duckdb"
    with open_database(db) as con, pytest.raises(InputNotFoundError, match=r"bwd\.csv"):
        ingest_runs(con, [run])
    with open_database(Path(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    out = runner.invoke(app, ["ingest", str(run), "--db", str(tmp_path / "cli.duckdb")])
    assert out.exit_code == 2  # a user error: one line on stderr, no traceback
    assert "\n" not in str(out.exception or "")


def test_a_log_without_its_argument_dump_is_refused(tmp_path: Path) -> None:
    run = _copy_run(tmp_path)
    log = next((run / "31664313").glob("*.log"))
    log.write_text("\n".join(ln for ln in log.read_text().splitlines() if "....." not in ln))
    with open_database(tmp_path / "bad.duckdb") as con, pytest.raises(InputNotFoundError, match="argument dump"):
        ingest_runs(con, [run])


@pytest.mark.parametrize(
    ("remove", "named"),
    [
        (["1"], ["kernel tables 1/ (fwd, bwd, encoder_fwd, encoder_bwd, reduce_grads, optimizer_step.csv)"]),
        (["0", "1", "2"], ["kernel tables 0/", "kernel tables 1/", "kernel tables 2/"]),
        (["2/fwd.csv", "2/optimizer_step.csv"], ["kernel tables 2/fwd.csv, 2/optimizer_step.csv"]),
        (["*.log"], ["the GPT-NeoX log (*.log"]),
        (["0", "1", "2", "*.log"], ["kernel tables 0/", "kernel tables 2/", "the GPT-NeoX log"]),
    ],
)
def test_a_decoded_run_names_every_missing_part(tmp_path: Path, remove: list[str], named: list[str]) -> None:
    """A job folder with parts removed is still found as a decoded run (not "no trace files"), and one
    line names every part it lacks; nothing is written."""
    run = _copy_run(tmp_path)
    job = run / "31664313"
    for pattern in remove:
        for path in job.glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    db = tmp_path / "bad.duckdb"
    with open_database(db) as con, pytest.raises(InputNotFoundError) as caught:
        ingest_runs(con, [run])
    message = str(caught.value)
    assert "\n" not in message and str(job) in message and "missing:" in message
    assert all(part in message for part in named), message
    with open_database(Path(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def _collective_sizes(db: Path, run_id: str) -> list[tuple]:
    with open_database(Path(db), read_only=True) as con:
        return con.execute(
            "SELECT rank, name, role, size_bytes, count(*) FROM collectives WHERE run_id = ? GROUP BY ALL ORDER BY ALL",
            [run_id],
        ).fetchall()


def _as_newer_torch(inner_op: str, dims: str, group: int) -> tuple[str, str]:
    """A kernel table's innermost operator and Input Dims as newer torch records them: collectives as
    their c10d operator over tensor lists (an all-gather's output list before its input list), a cat's
    tensors as one list."""
    args = json.loads(dims) if dims.startswith("[") else None
    if not args or not isinstance(args[0], list):
        return inner_op, dims
    if inner_op == "nccl:all_reduce":
        return "c10d::allreduce_", json.dumps([[args[0]], [], [], []])
    if inner_op == "nccl:_all_gather_base":
        output = [args[0][0] * group, *args[0][1:]]
        return "c10d::allgather_into_tensor_coalesced_", json.dumps([[output], [args[0]], []])
    if inner_op == "nccl:send":
        return "c10d::send", json.dumps([[args[0]], [], []])
    if inner_op == "aten::cat" and args[0] and all(a == [] for a in args[1:]):
        return inner_op, json.dumps([[args[0], args[0]], []])
    return inner_op, dims


@pytest.fixture(scope="module")
def tensor_list_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Llemma run with every kernel table's Input Dims rewritten as newer torch records them."""
    run = _copy_run(tmp_path_factory.mktemp("tensor_lists"))
    dp = parse_neox_log(next((run / "31664313").glob("*.log"))).data_parallel_size or 1
    for table in (run / "31664313").glob("**/*.csv"):
        with table.open(newline="") as handle:
            rows = list(csv.reader(handle))
        if rows[0][:1] != ["cpu_op_0"]:
            continue  # module times, comparisons
        for row in rows[1:]:
            row[3], row[5] = _as_newer_torch(row[3], row[5], dp)
        with table.open("w", newline="") as handle:
            csv.writer(handle).writerows(rows)
    return run


def test_tensor_list_dims_give_the_same_collective_sizes(llemma_db: Path, tensor_list_run: Path) -> None:
    db = tensor_list_run.parent / "rewritten.duckdb"
    with open_database(db) as con:
        ingest_runs(con, [tensor_list_run], IngestOptions(cluster="perlmutter", workers=1))
    rewritten = _collective_sizes(db, tensor_list_run.name)
    assert rewritten == _collective_sizes(llemma_db, "llemma_7B_4_2_2_4_4")
    assert any(name == "all_gather" and size for _, name, _, size, _ in rewritten)  # sized from its input list


@pytest.mark.slow
def test_without_best_batch_statistics_sends_come_from_the_measured_span(llemma_db: Path, tmp_path: Path) -> None:
    """Kernel tables without best_batch_statistics/ still rebuild: the sends are one kernel per send of the
    measured pp_p2p span, sized as the largest activation the traced sends carried, and the ingest says so."""
    run = _copy_run(tmp_path)
    shutil.rmtree(run / "31664313" / "best_batch_statistics")
    with open_database(tmp_path / "nobb.duckdb") as con:
        report = ingest_runs(con, [run], IngestOptions(cluster="perlmutter", workers=1))
        sends = con.execute(
            "SELECT max(size_bytes), count(*), count(match_id) FROM collectives WHERE name = 'send'"
        ).fetchone()
    assert any("no best_batch_statistics/" in w and "pp_p2p" in w for w in report.runs[0].warnings)
    with open_database(Path(llemma_db), read_only=True) as con:
        largest = con.execute("SELECT max(size_bytes) FROM collectives WHERE name = 'send'").fetchone()[0]
    assert sends[0] == largest and sends[1] == sends[2] > 0  # every send matched with its receive


def test_metadata_keeps_the_published_measurements(llemma_db: Path) -> None:
    with open_database(Path(llemma_db), read_only=True) as con:
        meta = json.loads(con.execute("SELECT metadata_json FROM runs").fetchone()[0])
    assert meta["best_batch_module_times"]["average"]["update"] == [9574937.0, 9575284.0, 9575449.0]
    assert "1F1B_max_optimizer" in meta["published_compares"]
    assert meta["neox_log"]["pipe_parallel_size"] == 4


@pytest.mark.parametrize("stored", ['{"best_batch_module_times": {', "[1, 2]", None])
def test_unreadable_run_metadata_is_one_line(tmp_path: Path, stored: str | None) -> None:
    """A decoded run whose stored metadata is cut short, not an object or missing: validate says what to
    do in one line (``sql.query.run_metadata`` reads it for every caller)."""
    with open_database(tmp_path / "x.duckdb") as con:
        con.execute("INSERT INTO runs (run_id, format, metadata_json) VALUES ('r', 'gpumodeling25', ?)", [stored])
        with pytest.raises(PredictionError, match=r"^run r carries no published module times; re-ingest"):
            validate_decoded_run(con, "r")


def test_flash_attention_causality_from_its_kernels() -> None:
    import polars as pl

    from tracecal.decode.shape_features import family_shape_table
    from tracecal.sources.gpumodeling25.read.decoded_run import read_kernel_table

    tables = [read_kernel_table(LLEMMA / "31664313" / "1" / f"{n}.csv") for n in ("fwd", "bwd")]
    rows = pl.concat(tables).filter(pl.col("inner_op").str.starts_with("FlashAttn"))
    frame = rows.select(
        pl.col("inner_op").alias("cpu_op_name"),
        pl.col("kernel").alias("name"),
        pl.lit("kernel").alias("kind"),
        pl.col("inner_dims").alias("input_dims"),
        pl.lit(None, pl.String).alias("input_types"),
        pl.lit(None, pl.String).alias("cpu_concrete_inputs"),
    )
    table = family_shape_table(frame)
    # the forward and the backward loop kernel say Is_causal; the backward's other kernels and the
    # autograd node take it from them
    assert set(table["cpu_op_name"]) == {"FlashAttnFunc", "FlashAttnFuncBackward"}
    assert table["causal"].to_list() == [True] * table.height
    noncausal = frame.with_columns(pl.col("name").str.replace(", false, true,", ", false, false,", literal=True))
    assert not any(family_shape_table(noncausal)["causal"].fill_null(False))


def test_layout_rendezvous_by_hand() -> None:
    """Two stages: stage 0 runs 10 ns then sends (5 ns measured), stage 1 runs 30 ns then receives (8 ns,
    its wait included): the transfer starts when the later arrives (30) and lasts the shorter (5)."""
    import polars as pl

    from tracecal.sources.gpumodeling25.rebuild.reconstruct import layout

    def plan(durations: list[int], gaps: list[int], keys: list[str | None]) -> pl.DataFrame:
        return pl.DataFrame({"dur_ns": durations, "gap_ns": gaps, "rendezvous": keys})

    (s0, e0), (s1, e1) = layout([plan([10, 5, 4], [0, 0, 2], [None, "a", None]), plan([30, 8], [0, 0], [None, "a"])])
    assert (s0.tolist(), e0.tolist()) == ([0, 10, 37], [10, 35, 41])
    assert (s1.tolist(), e1.tolist()) == ([0, 30], [30, 35])
    with pytest.raises(TraceFormatError, match="wait for each other"):
        layout([plan([1, 1], [0, 0], ["x", "y"]), plan([1, 1], [0, 0], ["y", "x"])])


def test_occurrences_undo_the_divide_by_three() -> None:
    import polars as pl

    from tracecal.sources.gpumodeling25.read.decoded_run import occurrences

    # 2 kernels of 10 us, true gap 1 us before the second, over N = 6 occurrences: written 1 * 6 / 3 = 2
    table = pl.DataFrame({"dur_us": [10.0, 10.0], "overhead_us": [0.0, 2.0]})
    assert occurrences(table, span_us=21.0, most=80) == pytest.approx(6.0)
    assert occurrences(table, span_us=None, most=80) == 80.0  # no span: the most the traced window holds
    assert occurrences(table, span_us=19.0, most=80) == 80.0  # a span shorter than the kernels says nothing
    assert occurrences(table, span_us=20.01, most=80) == 80.0  # capped by what the window can hold


def test_module_times_are_mean_gpu_spans_by_hand() -> None:
    """Two occurrences of one frame on rank 0: spans 30 and 50 ns measured (10 and 20 replayed)."""
    from types import SimpleNamespace

    import numpy as np
    import polars as pl

    from tracecal.sources.gpumodeling25.validate.module_times import module_times, per_position

    nodes = pl.DataFrame(
        {"node": [0, 1, 2, 3], "node_kind": "activity", "rank": [0, 0, 0, 0], "event_id": [10, 11, 12, 13]}
    )
    measured = np.array([0, 10, 20, 30, 100, 120, 130, 150])  # start, end per node
    replayed = np.array([0, 5, 5, 10, 100, 110, 110, 120])
    prediction = SimpleNamespace(graph=SimpleNamespace(nodes=nodes, measured_times=measured), replayed=replayed)
    members = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0],
            "scope_id": [1, 1, 2, 2],
            "scope_name": ["deepspeed/runtime/pipe/module.py(319): forward"] * 4,
            "event_id": [10, 11, 12, 13],
        }
    )
    times = module_times(members, prediction)  # type: ignore[arg-type]
    row = times.row(0, named=True)
    assert (row["module"], row["occurrences"]) == ("stage_fwd", 2)
    assert row["measured_us"] == pytest.approx(40 / 1e3) and row["predicted_us"] == pytest.approx(15 / 1e3)
    assert per_position(times, [0, 4, 8], "measured_us") == {"stage_fwd": [0.04, 0.0, 0.0]}


def test_a_bad_decoded_run_is_skipped_under_on_error_skip(tmp_path: Path) -> None:
    run = _copy_run(tmp_path)
    (run / "31664313" / "2" / "fwd.csv").unlink()
    with open_database(tmp_path / "skip.duckdb") as con:
        report = ingest_runs(con, [run], IngestOptions(on_error="skip", workers=1))
        assert report.runs == () and "fwd.csv" in report.skipped[0].reason
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)

"""`tracecal samples measure compute|comm`: exit codes, messages, what lands in the database."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tracecal.cli.main import app

runner = CliRunner()
MEASURE = ["samples", "measure"]


def _count(db: Path, where: str = "true") -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(f"SELECT count(*) FROM samples WHERE {where}").fetchall()[0][0]
    finally:
        con.close()


def test_measure_help_lists_both_commands() -> None:
    result = runner.invoke(app, ["samples", "measure", "--help"])
    assert result.exit_code == 0
    assert "compute" in result.output and "comm" in result.output
    for command in ("compute", "comm"):
        sub = runner.invoke(app, ["samples", "measure", command, "--help"])
        assert sub.exit_code == 0 and "--cluster" in sub.output


def test_the_old_sample_spelling_still_runs_hidden_and_says_it_moved(db_path: Path) -> None:
    """`tracecal sample compute|comm` is kept for one release: not in `tracecal --help`, and a
    warning naming the new spelling, then the same command."""
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0 and "samples" in top.output
    assert not any(line.split()[:1] == ["sample"] for line in top.output.splitlines())
    args = ["compute", "--cluster", "c", "--config", "ci", "--family", "softmax", "--dry-run", "--db", str(db_path)]
    old = runner.invoke(app, ["sample", *args])
    new = runner.invoke(app, [*MEASURE, *args])
    assert old.exit_code == 0 and new.exit_code == 0
    assert "`tracecal sample` is now `tracecal samples measure`" in old.output
    assert "is now" not in new.output
    assert "points to sample" in old.output and "points to sample" in new.output


def test_compute_from_a_shipped_grid_then_resume(db_path: Path) -> None:
    args = [*MEASURE, "compute", "--cluster", "laptop", "--config", "ci", "--family", "softmax",
            "--family", "norm", "--repeats", "2", "--warmup", "0", "--db", str(db_path)]  # fmt: skip
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "laptop: 6 points, 0 already stored, 6 written, 0 skipped" in first.output
    assert _count(db_path, "cluster = 'laptop' AND family IN ('softmax', 'norm')") == 6
    again = runner.invoke(app, args)
    assert "6 already stored, 0 written" in again.output


def test_compute_timing_profiler_is_recorded_on_each_sample(db_path: Path) -> None:
    args = [*MEASURE, "compute", "--cluster", "c", "--config", "ci", "--family", "softmax", "--repeats", "2",
            "--warmup", "0", "--timing", "profiler", "--db", str(db_path)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _count(db_path, 'params_json LIKE \'%"timing":"profiler"%\'') == _count(db_path) > 0


def test_compute_passes_and_processes_reach_every_sample(db_path: Path) -> None:
    args = [*MEASURE, "compute", "--cluster", "c", "--config", "ci", "--family", "softmax", "--repeats", "2",
            "--warmup", "0", "--passes", "3", "--processes", "2", "--db", str(db_path)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "3 pass(es), 2 process(es)" in " ".join(result.output.split())
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        rows = con.execute(
            "SELECT json_extract(params_json, '$.passes')::INT, json_extract(params_json, '$.processes')::INT, "
            "repeats FROM samples"
        ).fetchall()
    finally:
        con.close()
    # every point timed 2 repeats in each of 3 passes, by one of 2 concurrent workers
    assert rows and set(rows) == {(3, 2, 6)}
    # a different measurement than one lone process: the same points are sampled again, not skipped
    again = runner.invoke(app, [*args[:-6], "--db", str(db_path)])
    assert again.exit_code == 0 and "0 already stored" in again.output


def test_compute_dtype_override_and_sharding(db_path: Path) -> None:
    base = [*MEASURE, "compute", "--cluster", "c", "--config", "ci", "--family", "softmax", "--repeats", "1",
            "--warmup", "0", "--dtype", "bfloat16", "--dtype", "float32", "--parts", "2",
            "--db", str(db_path)]  # fmt: skip
    assert runner.invoke(app, [*base, "--part", "1"]).exit_code == 0
    assert _count(db_path) == 2
    assert runner.invoke(app, [*base, "--part", "2"]).exit_code == 0
    assert _count(db_path, "dtype = 'bfloat16'") == 2 and _count(db_path) == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give exactly one of --config GRID or --from-run RUN"),
        (["--config", "ci", "--from-run", "x"], "give exactly one of --config GRID or --from-run RUN"),
        (["--config", "nope"], "no grid file nope and no shipped grid of that name"),
        (["--config", "ci", "--family", "conv"], "no points to sample after --family/--dtype/--part"),
        (["--config", "ci", "--parts", "2", "--part", "3"], "--part must be between 1 and --parts (2)"),
        (["--from-run", "missing"], "run 'missing' is not in the database"),
        (["--config", "ci", "--dtype", "int8"], "dtype 'int8' is not one of float32"),
        (["--config", "ci", "--timing", "cuda_events"], "--timing cuda_events cannot time on cpu"),
    ],
)
def test_compute_bad_input_is_one_line_and_exit_2(db_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, [*MEASURE, "compute", "--cluster", "c", *args, "--db", str(db_path)])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_comm_spawns_gloo_ranks_and_stores_the_samples(db_path: Path) -> None:
    args = [*MEASURE, "comm", "--cluster", "laptop", "--sizes", "4K,64K", "--collectives", "all_reduce,send",
            "--repeats", "3", "--warmup", "1", "--db", str(db_path)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "laptop: 4 comm samples written (2 gloo ranks" in " ".join(result.output.split())
    assert _count(db_path, "family = 'comm' AND group_size = 2 AND size_bytes IN (4096, 65536)") == 4
    again = runner.invoke(app, args)
    assert "0 comm samples written" in " ".join(again.output.split())


def test_comm_bad_input(db_path: Path) -> None:
    result = runner.invoke(app, [*MEASURE, "comm", "--cluster", "c", "--sizes", "big", "--db", str(db_path)])
    assert result.exit_code == 2 and "size 'BIG' is not a byte count" in result.output
    result = runner.invoke(app, [*MEASURE, "comm", "--cluster", "c", "--collectives", "gossip", "--db", str(db_path)])
    assert result.exit_code == 2 and "unknown collective 'gossip'" in result.output


def test_cuda_without_a_gpu_is_one_clear_error(db_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    args = [*MEASURE, "compute", "--cluster", "c", "--config", "ci", "--device", "cuda", "--db", str(db_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "--device cuda given but torch sees no CUDA device; use --device cpu" in " ".join(result.output.split())


def test_dry_run_counts_what_is_left_and_times_nothing(db_path: Path) -> None:
    base = [*MEASURE, "compute", "--cluster", "c", "--config", "ci", "--family", "norm", "--db", str(db_path)]
    result = runner.invoke(app, [*base, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "c: 4 points to sample" in result.output and _count(db_path) == 0
    half = runner.invoke(app, [*base, "--dtype", "float32", "--repeats", "1", "--part", "1", "--parts", "2"])
    assert half.exit_code == 0
    assert "c: 2 points to sample" in runner.invoke(app, [*base, "--dry-run"]).output

"""Run discovery (docs/discovery.md): layouts, rank from path, parallel layout sources, world size."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import GPUMODELING25, KINETO
from tracecal.errors import InputNotFoundError, RankConflictError, TraceFormatError
from tracecal.ingest.discover import (
    ParallelLayout,
    discover_run,
    layout_from_process_groups,
    layout_from_run_name,
    missing_ranks,
    rank_from_path,
    trace_format,
    world_size_of,
)
from tracecal.ingest.parse import parse_trace_file
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sql.connection import open_database

PERLMUTTER = GPUMODELING25 / "runs" / "perlmutter"


def _tiny_trace(path: Path, rank: int | None = None, events: int = 3) -> Path:
    """A minimal Kineto trace; ``rank`` None leaves out distributedInfo."""
    document: dict[str, object] = {
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5}
            for i in range(events)
        ]
    }
    if rank is not None:
        document["distributedInfo"] = {"rank": rank, "world_size": 4, "backend": "nccl"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    ("relative", "rank"),
    [
        ("rank-3.json.gz", 3),
        ("sampled_rank-1.json.gz", 1),
        ("rank12.pt.trace.json", 12),
        ("trace_rank_5.json", 5),
        ("worker7_step_12.1694128201553.pt.trace.json.gz", 7),
        ("prof/6/nid001234_5678.1700000000123.pt.trace.json", 6),
        ("rank-2/host_1.1.pt.trace.json", 2),
        ("nid001234_5678.1700000000123.pt.trace.json", None),
        ("framework3000.json", None),
    ],
)
def test_rank_from_path(tmp_path: Path, relative: str, rank: int | None) -> None:
    assert rank_from_path(tmp_path / relative, tmp_path) == rank


def test_formats_by_suffix() -> None:
    assert trace_format(Path("a.pt.trace.json.gz")) == "kineto"
    assert trace_format(Path("a.json")) == "kineto"
    assert trace_format(Path("a.sqlite.gz")) == "nsys"
    assert trace_format(Path("a.nsys-rep")) == "nsys"
    assert trace_format(Path("run.json")) is None
    assert trace_format(Path("train.log")) is None


def test_nested_tensorboard_layout(tmp_path: Path) -> None:
    run = tmp_path / "GPT_20B_4_4_8_32_4"
    for rank in (0, 1, 5):
        _tiny_trace(run / "profiles" / str(rank) / f"nid00{rank}_42.1700000000.pt.trace.json")
    (run / "profiles" / "notes.txt").write_text("ignored")
    found = discover_run(run)
    assert sorted(f.path_rank for f in found.files) == [0, 1, 5]
    assert found.format == "kineto"
    assert found.layout == ParallelLayout(
        pp=4, tp=4, dp=8, nodes=32, gpus_per_node=4, model="GPT_20B", source="run_name", metadata=None
    )


def test_layout_from_run_name_variants() -> None:
    assert layout_from_run_name("llemma_7B_4_2_2_4_4") == ParallelLayout(4, 2, 2, 4, 4, "llemma_7B", "run_name")
    assert layout_from_run_name("GPT_20B_4_4_8") == ParallelLayout(4, 4, 8, None, None, "GPT_20B", "run_name")
    assert layout_from_run_name("dlrm_8rank") is None


def test_layout_subdirectory(tmp_path: Path) -> None:
    run = tmp_path / "myrun"
    _tiny_trace(run / "PP4_MP2_DP8_ZERO1" / "rank-0.json")
    layout = discover_run(run).layout
    assert (layout.pp, layout.tp, layout.dp, layout.source) == (4, 2, 8, "run_name")


@pytest.mark.parametrize(
    ("run_name", "expected"),
    [("GPT_20B_4_4_8_32_4", (4, 4, 8)), ("llama_13B_4_8_2_16_4", (4, 8, 2)), ("GPT_20B_8_4_4_32_4", (8, 4, 4))],
)
def test_layout_from_real_gpt_neox_log(tmp_path: Path, run_name: str, expected: tuple[int, int, int]) -> None:
    """A real GPT-NeoX argument dump, in a run whose name says nothing."""
    (log,) = (PERLMUTTER / run_name).glob("*/*.log")
    run = tmp_path / "job_31694544"
    run.mkdir()
    shutil.copy(log, run / log.name)
    _tiny_trace(run / "rank-0.json")
    layout = discover_run(run).layout
    assert (layout.pp, layout.tp, layout.dp, layout.source) == (*expected, "log")


def test_run_json_is_a_layout_source_and_kept_as_metadata(tmp_path: Path) -> None:
    run = tmp_path / "local_gpt"
    settings = {"model": "tiny_gpt", "pp": 2, "tp": 2, "dp": 1, "layers": 4, "backend": "gloo"}
    (tmp_path / "local_gpt").mkdir()
    (run / "run.json").write_text(json.dumps(settings))
    _tiny_trace(run / "rank-0.json")
    found = discover_run(run)
    assert [f.path.name for f in found.files] == ["rank-0.json"]
    assert (found.layout.pp, found.layout.tp, found.layout.dp, found.layout.model) == (2, 2, 1, "tiny_gpt")
    assert found.layout.source == "run_json"
    assert found.layout.metadata == settings


def test_flags_win_and_fill_single_fields(tmp_path: Path) -> None:
    run = tmp_path / "GPT_20B_4_4_8_32_4"
    _tiny_trace(run / "rank-0.json")
    full = discover_run(run, ParallelLayout(pp=2, tp=8, dp=8))
    assert (full.layout.pp, full.layout.tp, full.layout.dp, full.layout.source) == (2, 8, 8, "flags")
    assert full.layout.nodes == 32  # not given as a flag: from the run name
    partial = discover_run(run, ParallelLayout(nodes=16))
    assert (partial.layout.pp, partial.layout.nodes, partial.layout.source) == (4, 16, "run_name")


def test_layout_from_named_process_groups() -> None:
    groups = [
        {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 16, "ranks": list(range(16))},
        {"pg_name": "1", "pg_desc": "mesh_tp", "pg_size": 4, "ranks": [0, 1, 2, 3]},
        {"pg_name": "2", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": [0, 4]},
        {"pg_name": "3", "pg_desc": "mesh_pp", "pg_size": 2, "ranks": [0, 8]},
    ]
    assert layout_from_process_groups(groups) == ParallelLayout(pp=2, tp=4, dp=2, source="pg_config")
    assert layout_from_process_groups(groups[:1]) is None


def test_world_size_and_missing_ranks() -> None:
    assert world_size_of([8, 8, None], 3) == 8
    assert world_size_of([None, None], 2) == 2
    assert missing_ranks([0, 1, 5], 8) == [2, 3, 4, 6, 7]


def test_bad_run_json_is_named(tmp_path: Path) -> None:
    run = tmp_path / "r"
    _tiny_trace(run / "rank-0.json")
    (run / "run.json").write_text("{not json")
    with pytest.raises(TraceFormatError, match=r"run\.json"):
        discover_run(run)


def test_missing_run_is_input_not_found(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match="does not exist"):
        discover_run(tmp_path / "absent")


def test_parse_dispatches_on_suffix(tmp_path: Path) -> None:
    (parsed,) = parse_trace_file(_tiny_trace(tmp_path / "rank-0.json", rank=2))
    assert (parsed.rank, parsed.rank_source, parsed.world_size, parsed.events.num_rows) == (2, "distributedInfo", 4, 3)
    with pytest.raises(TraceFormatError, match="not a trace file"):
        parse_trace_file(tmp_path / "notes.txt")


def test_ranks_from_paths_and_missing_ranks_in_the_database(tmp_path: Path, db_path: Path) -> None:
    run = tmp_path / "cpu_run"
    for rank in (0, 2):
        _tiny_trace(run / f"rank{rank}.json")
    with open_database(db_path) as con:
        report = ingest_runs(con, [run], IngestOptions(workers=1))
    (summary,) = report.runs
    assert summary.world_size == 2 and summary.missing_ranks == (1,)
    with open_database(Path(db_path), read_only=True) as con:
        assert con.execute("SELECT rank, rank_source FROM ranks ORDER BY 1").fetchall() == [(0, "path"), (2, "path")]


def test_world_size_from_distributed_info(tmp_path: Path, db_path: Path) -> None:
    run = tmp_path / "partial"
    _tiny_trace(run / "a.json", rank=0)
    _tiny_trace(run / "b.json", rank=3)
    with open_database(db_path) as con:
        (summary,) = ingest_runs(con, [run], IngestOptions(workers=1)).runs
    assert summary.world_size == 4 and summary.missing_ranks == (1, 2)


def test_rank_unknown_is_an_error_naming_the_file(tmp_path: Path, db_path: Path) -> None:
    run = tmp_path / "anonymous"
    _tiny_trace(run / "host_a.json")
    _tiny_trace(run / "host_b.json")
    with open_database(db_path) as con, pytest.raises(RankConflictError, match=r"host_[ab]\.json"):
        ingest_runs(con, [run], IngestOptions(workers=1))


def test_dlrm_ranks_come_from_distributed_info() -> None:
    found = discover_run(KINETO / "dlrm_8rank")
    assert sorted(f.path_rank for f in found.files) == list(range(8))
    assert found.layout == ParallelLayout()

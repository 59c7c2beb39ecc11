"""Decoding the real shared traces end to end (ingest -> decode -> views)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from conftest import KINETO, NSYS
from typer.testing import CliRunner

from tracecal.cli.main import app
from tracecal.decode.rank import DECODE_COLUMNS
from tracecal.ingest.executors import InProcess
from tracecal.pipeline import decode as pipeline_decode
from tracecal.pipeline import rank_decode
from tracecal.pipeline.decode import decode_stored_run
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sql.connection import open_database, query_arrow
from tracecal.sql.loaders import SHARD_RUN_ID
from tracecal.vocabulary import ParallelLayout

DLRM = KINETO / "dlrm_8rank"
SINGLES = {
    # run id: (path, iterations, gpu)
    "a100_ddp_rank0_of_2": (KINETO / "single" / "a100_ddp_rank0_of_2.json.gz", 3, True),
    "cpu_gloo_rank-34_of_300": (KINETO / "single" / "cpu_gloo_rank-34_of_300.pt.trace.json.gz", 5, False),
    "mi300x_ddp_resnet_rank0_of_8": (KINETO / "single" / "mi300x_ddp_resnet_rank0_of_8.json.gz", 3, True),
    "h100_bert_small_inference": (KINETO / "single" / "h100_bert_small_inference.json.gz", 1, True),
    "v100_resnet50_2021_schema": (KINETO / "single" / "v100_resnet50_2021_schema.pt.trace.json.gz", 6, True),
}


@pytest.fixture(scope="module")
def dlrm_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("dlrm") / "dlrm.duckdb"
    with open_database(db) as con:
        report = ingest_runs(con, [DLRM], IngestOptions(workers=2))
    assert report.runs[0].decode is not None
    return db


def q(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    with open_database(Path(db), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


def test_dlrm_every_collective_instance_matched_on_all_ranks(dlrm_db: Path) -> None:
    per_name = q(
        dlrm_db,
        "SELECT name, count(DISTINCT match_id), count(*), count(match_id), min(n), max(n) FROM ("
        "  SELECT *, count(*) OVER (PARTITION BY match_id) AS n FROM collectives) GROUP BY name ORDER BY name",
    )
    # 3 all-reduce and 5 all-to-all instances per rank (NCCL SendRecv kernels launched by nccl:all_to_all)
    assert per_name == [("all_reduce", 3, 24, 24, 8, 8), ("all_to_all", 5, 40, 40, 8, 8)]
    sizes = q(dlrm_db, "SELECT DISTINCT name, size_bytes FROM collectives WHERE rank = 0 ORDER BY ALL")
    assert ("all_reduce", 394241 * 4) in sizes and ("all_to_all", 6144 * 4) in sizes  # from nccl:* Input Dims


def test_dlrm_clock_offsets_and_best_iteration(dlrm_db: Path) -> None:
    ranks = q(dlrm_db, "SELECT rank, clock_offset_ns, clock_residual_ns FROM ranks ORDER BY rank")
    assert [r[0] for r in ranks] == list(range(8))
    assert ranks[0][1] == 0 and all(r[1] is not None and r[2] is not None for r in ranks)
    assert all(abs(r[1]) < 50_000 and r[2] < 10_000 for r in ranks)  # one node: µs-level skew
    best = q(dlrm_db, "SELECT iteration, dur_ns, ranks, on_all_ranks FROM best_iteration")
    slowest = q(dlrm_db, "SELECT max(dur_ns) FROM iterations WHERE iteration = 10")[0][0]
    assert best == [(10, slowest, 8, True)]
    stats = q(dlrm_db, "SELECT iterations, min_ns, best_iteration FROM iteration_stats")
    assert stats == [(1, slowest, 10)]


def test_dlrm_linking_families_phases(dlrm_db: Path) -> None:
    linked, total = q(
        dlrm_db,
        "SELECT sum(dur_ns) FILTER (WHERE cpu_op_event_id IS NOT NULL), sum(dur_ns) FROM operators "
        "WHERE kind = 'kernel'",
    )[0]
    assert linked / total >= 0.99
    missing = q(dlrm_db, "SELECT count(*) FROM operators WHERE family IS NULL OR phase IS NULL OR component IS NULL")
    assert missing == [(0,)]
    phases = {r[0] for r in q(dlrm_db, "SELECT DISTINCT phase FROM operators")}
    assert {"fwd", "bwd", "optimizer"} <= phases
    opt = q(dlrm_db, "SELECT count(*) FROM operators WHERE scope_name = '## optimizer ##' AND phase <> 'optimizer'")
    assert opt == [(0,)]
    # ids are exact: every operator's runtime call and CPU op exist in events with the expected kinds
    bad = q(
        dlrm_db,
        "SELECT count(*) FROM operators o LEFT JOIN events r ON r.run_id = o.run_id AND r.rank = o.rank "
        "AND r.event_id = o.runtime_event_id LEFT JOIN events c ON c.run_id = o.run_id AND c.rank = o.rank "
        "AND c.event_id = o.cpu_op_event_id WHERE (o.runtime_event_id IS NOT NULL AND r.kind <> 'cuda_runtime') "
        "OR (o.cpu_op_event_id IS NOT NULL AND c.kind <> 'cpu_op') OR c.ts_ns > r.ts_ns",
    )
    assert bad == [(0,)]


def test_dlrm_breakdowns_sum_to_span(dlrm_db: Path) -> None:
    comp = q(
        dlrm_db,
        "SELECT rank, sum(time_ns), any_value(span_ns), count(*) FILTER (WHERE component = 'idle') "
        "FROM component_breakdown GROUP BY rank ORDER BY rank",
    )
    assert len(comp) == 8
    spans = dict(q(dlrm_db, "SELECT rank, gpu_end_ns - gpu_start_ns FROM iterations WHERE iteration = 10"))
    for rank, total, span, idle_rows in comp:
        assert total == span == spans[rank] and idle_rows == 1
    temporal = q(
        dlrm_db, "SELECT rank, compute_ns + communication_ns + memory_ns + idle_ns - span_ns FROM temporal_breakdown"
    )
    assert len(temporal) == 8 and all(r[1] == 0 for r in temporal)


def test_dlrm_views_and_redecode_are_idempotent(dlrm_db: Path) -> None:
    before = q(dlrm_db, "SELECT count(*), sum(dur_ns) FROM operators")
    with open_database(dlrm_db) as con:
        summary = decode_stored_run(con, "dlrm_8rank")
    assert q(dlrm_db, "SELECT count(*), sum(dur_ns) FROM operators") == before
    assert summary.matched_instances == 8 and summary.unmatched_collectives == 0 and summary.best_iteration == 10
    comm = q(dlrm_db, "SELECT collective, sum(count), sum(instances) FROM comm_summary GROUP BY ALL ORDER BY ALL")
    assert comm == [("all_reduce", 24, 3), ("all_to_all", 40, 5)]
    assert q(dlrm_db, "SELECT round(sum(share), 6) FROM kernel_breakdown") == [(1.0,)]
    assert q(dlrm_db, "SELECT round(sum(share), 6) FROM op_summary") == [(1.0,)]


def _derived_rows(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple]]:
    tables = {
        t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("operators", "collectives", "iterations")
    }
    tables["ranks"] = con.execute("SELECT rank, clock_offset_ns, clock_residual_ns FROM ranks ORDER BY rank").fetchall()
    tables["runs"] = con.execute("SELECT iteration_marker FROM runs").fetchall()
    return tables


def test_worker_decode_re_decode_and_a_contradicted_layout_give_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside ingest each rank is decoded where it was parsed, from its shard (one read per rank); a
    re-decode reads the stored run in one batch; a rank a worker decoded with a layout the whole run
    contradicts is decoded again by the loader: the same rows every time."""
    reads: list[list] = []
    read = pipeline_decode.read_events
    monkeypatch.setattr(
        pipeline_decode,
        "read_events",
        lambda con, run_id, columns, first, last: (
            reads.append([run_id, first, last]) or read(con, run_id, columns, first, last)
        ),
    )
    with open_database(tmp_path / "a.duckdb") as con:
        ingest_runs(con, [DLRM], IngestOptions(workers=1), executor=InProcess())
        assert reads == [[SHARD_RUN_ID, r, r] for r in range(8)]  # in-process executor: files in order
        ingested = _derived_rows(con)
        assert len(ingested["operators"]) == 2244 and len(ingested["collectives"]) == 64
        reads.clear()
        decode_stored_run(con, "dlrm_8rank")
        assert reads == [["dlrm_8rank", 0, 7]] and _derived_rows(con) == ingested
    reads.clear()
    wrong = ParallelLayout(pp=1, tp=8, dp=1, world_size=8)
    monkeypatch.setattr(rank_decode, "assumed_layout", lambda plan, parsed: wrong)
    with open_database(tmp_path / "b.duckdb") as con:
        ingest_runs(con, [DLRM], IngestOptions(workers=1), executor=InProcess())
        assert reads[-1] == ["dlrm_8rank", 0, 7]  # every rank decoded again from the stored run
        assert _derived_rows(con) == ingested


@pytest.mark.parametrize("run", [DLRM, NSYS / "mfu_2gpu_after.sqlite.gz"], ids=["dlrm_8rank", "mfu_2gpu_after"])
def test_a_workers_shard_reads_as_the_stored_events(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``events`` a worker decodes from (a view of its rank's Parquet shard) have the rows, values
    and types of the same rank's events read back from the database."""
    seen: dict[int, pl.DataFrame] = {}
    decode = rank_decode.decode_rank_parts

    def capture(con: duckdb.DuckDBPyConnection, run_id: str, sizes: list[tuple[int, int]], **kwargs: Any) -> Any:
        frame = pl.from_arrow(query_arrow(con, f"SELECT {', '.join(DECODE_COLUMNS)} FROM events ORDER BY event_id", []))
        assert isinstance(frame, pl.DataFrame)
        seen[sizes[0][0]] = frame
        return decode(con, run_id, sizes, **kwargs)

    monkeypatch.setattr(rank_decode, "decode_rank_parts", capture)
    with open_database(tmp_path / "h.duckdb") as con:
        ingest_runs(con, [run], IngestOptions(workers=1), executor=InProcess())  # the patch holds here only
        stored = pl.from_arrow(
            query_arrow(con, f"SELECT {', '.join(DECODE_COLUMNS)} FROM events ORDER BY rank, event_id", [])
        )
    assert isinstance(stored, pl.DataFrame) and stored.height > 10_000
    shards = pl.concat([seen[r] for r in sorted(seen)])
    assert shards.schema == stored.schema
    assert shards.equals(stored)
    assert (
        stored.get_column("name").n_unique() > 100
        and stored.get_column("concrete_inputs").null_count() == stored.height
    )


def test_iterations_command(dlrm_db: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["iterations", "dlrm_8rank", "--db", str(dlrm_db)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "best iteration: 10" in result.output and "clock alignment" in result.output
    missing = runner.invoke(app, ["iterations", "nope", "--db", str(dlrm_db)])
    assert missing.exit_code == 2 and "run 'nope' is not in the database" in missing.output


@pytest.mark.slow
@pytest.mark.parametrize("run_id", sorted(SINGLES))
def test_single_rank_traces(run_id: str, tmp_path: Path) -> None:
    path, iterations, gpu = SINGLES[run_id]
    db = tmp_path / "t.duckdb"
    with open_database(db) as con:
        report = ingest_runs(con, [path], IngestOptions(workers=1))
    d = report.runs[0].decode
    assert d is not None and d.iterations == iterations and d.markers_found
    assert q(db, "SELECT count(*) FROM collectives WHERE match_id IS NOT NULL") == [(0,)]  # nobody to match
    assert q(db, "SELECT count(*) FROM operators WHERE family IS NULL OR phase IS NULL") == [(0,)]
    assert q(db, "SELECT count(*) FROM best_iteration") == [(1,)]
    if gpu:
        # kernels whose launch was recorded are linked to a CPU operator; the others were launched
        # before the capture (2021 trace) or their runtime records were dropped (ROCm trace)
        share = q(
            db,
            "SELECT sum(dur_ns) FILTER (WHERE cpu_op_event_id IS NOT NULL) / sum(dur_ns) FROM operators "
            "WHERE kind = 'kernel' AND runtime_event_id IS NOT NULL",
        )[0][0]
        assert share >= 0.97
        sums = q(db, "SELECT rank, sum(time_ns) - any_value(span_ns) FROM component_breakdown GROUP BY rank")
        assert sums and all(r[1] == 0 for r in sums)
    else:
        assert d.linked_kernel_share is None
        assert q(db, "SELECT count(*), sum(size_bytes) FROM collectives WHERE name = 'all_reduce'")[0][0] == 10


@pytest.mark.slow
def test_sampled_two_of_128_and_nsight_two_gpus(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with open_database(db) as con:
        report = ingest_runs(
            con, [KINETO / "sampled_2_of_128", NSYS / "mfu_2gpu_after.sqlite.gz"], IngestOptions(workers=2)
        )
    sampled, nsys = (r.decode for r in report.runs)
    assert sampled is not None and sampled.iterations == 4 and sampled.linked_kernel_share >= 0.99
    assert nsys is not None and not nsys.markers_found and nsys.iterations == 2
    # Nsight: no External ids, operators linked by time on the launching thread
    links = dict(q(db, "SELECT link, count(*) FROM operators WHERE run_id = 'mfu_2gpu_after' GROUP BY link"))
    assert "external_id" not in links and links["time"] > 0.9 * sum(links.values())
    matched = q(db, "SELECT count(*), count(match_id) FROM collectives WHERE run_id = 'mfu_2gpu_after'")[0]
    assert matched[1] >= 0.9 * matched[0]
    offsets = q(db, "SELECT clock_offset_ns FROM ranks WHERE run_id = 'mfu_2gpu_after' ORDER BY rank")
    assert offsets[0] == (0,) and offsets[1][0] is not None

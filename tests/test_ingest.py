"""Kineto ingestion on every shared trace, checked against an independent standard-library reading."""

from __future__ import annotations

import gzip
import importlib.abc
import json
import sys
from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from tests.conftest import KINETO
from tracecal.cli.main import app
from tracecal.ingest.discover import discover_run
from tracecal.ingest.executors import InProcess, Parsing
from tracecal.pipeline import ingest as pipeline_ingest
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sql.connection import open_database

SHARED_FILES = sorted(KINETO.glob("*/*.json.gz"))
RUNS = [KINETO / "dlrm_8rank", KINETO / "sampled_2_of_128", *sorted((KINETO / "single").glob("*.json.gz"))]
KERNEL_CATEGORIES = {"kernel", "Kernel"}

runner = CliRunner()


def _expected(path: Path) -> dict[str, object]:
    """What the trace holds, read with json + gzip only; µs decimals parsed exactly."""
    with gzip.open(path, "rt") as handle:
        document = json.load(handle, parse_float=Decimal)
    events = document["traceEvents"] if isinstance(document, dict) else document
    complete = [e for e in events if e.get("ph") == "X"]

    def ns(us: int | Decimal) -> int:
        return int((Decimal(us) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))

    return {
        "categories": Counter(e.get("cat") for e in complete),
        "kernel_ns": sum(ns(e["dur"]) for e in complete if e.get("cat") in KERNEL_CATEGORIES),
        "first_ts_ns": min(ns(e["ts"]) for e in complete),
        "last_end_ns": max(ns(e["ts"]) + ns(e.get("dur", 0)) for e in complete),
        "rank": (document.get("distributedInfo") or {}).get("rank") if isinstance(document, dict) else None,
    }


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every shared Kineto trace ingested once (two workers): the runs of the tests below."""
    path = tmp_path_factory.mktemp("ingest") / "shared.duckdb"
    with open_database(path) as con:
        ingest_runs(con, RUNS, IngestOptions(workers=2))
    return path


@pytest.mark.parametrize("trace", SHARED_FILES, ids=lambda p: p.name.split(".")[0])
def test_every_shared_trace_matches_an_independent_reading(shared_db: Path, trace: Path) -> None:
    expected = _expected(trace)
    with open_database(Path(shared_db), read_only=True) as con:
        (rank,) = con.execute("SELECT rank FROM ranks WHERE file = ?", [str(trace.resolve())]).fetchone()
        run_id, file_rank = con.execute(
            "SELECT run_id, rank FROM ranks WHERE file = ?", [str(trace.resolve())]
        ).fetchone()
        where = "run_id = ? AND rank = ?"
        categories = dict(
            con.execute(f"SELECT category, count(*) FROM events WHERE {where} GROUP BY 1", [run_id, rank]).fetchall()
        )
        kernel_ns, first_ts, last_end = con.execute(
            f"SELECT sum(dur_ns) FILTER (WHERE kind = 'kernel'), min(ts_ns), max(ts_ns + coalesce(dur_ns, 0)) "
            f"FROM events WHERE {where}",
            [run_id, rank],
        ).fetchone()
    assert categories == dict(expected["categories"])
    assert (kernel_ns or 0) == expected["kernel_ns"]
    assert first_ts == expected["first_ts_ns"]
    assert last_end == expected["last_end_ns"]
    if expected["rank"] is not None:
        assert file_rank == expected["rank"]


def test_trace_ingest_dlrm_gives_eight_ranks(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[object] = []
    real_ingest_runs = pipeline_ingest.ingest_runs

    def ingest_runs_noting_threads(con: duckdb.DuckDBPyConnection, *args: Any, **kwargs: Any) -> Any:
        threads.append(con.execute("SELECT current_setting('threads')").fetchall()[0][0])
        return real_ingest_runs(con, *args, **kwargs)

    monkeypatch.setattr(pipeline_ingest, "ingest_runs", ingest_runs_noting_threads)
    result = runner.invoke(app, ["ingest", str(KINETO / "dlrm_8rank"), "--db", str(db_path), "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert threads == [pipeline_ingest.INGEST_THREADS]  # the command's connection is opened with it
    assert "dlrm_8rank" in result.output
    with open_database(Path(db_path), read_only=True) as con:
        ranks = [r for (r,) in con.execute("SELECT rank FROM ranks WHERE run_id = 'dlrm_8rank' ORDER BY 1").fetchall()]
        world, found, fmt = con.execute("SELECT world_size, ranks_found, format FROM runs").fetchone()
        kernels = con.execute("SELECT sum(kernels) FROM ranks").fetchone()[0]
        stored = con.execute("SELECT count(*) FROM events WHERE kind = 'kernel'").fetchone()[0]
    assert ranks == list(range(8))
    assert (world, found, fmt) == (8, 8, "kineto")
    assert kernels == stored > 0


def _table_counts(path: Path) -> dict[str, int]:
    with open_database(Path(path), read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("runs", "ranks", "events")}


def test_reingest_replaces_the_run(db_path: Path) -> None:
    run = KINETO / "sampled_2_of_128"
    with open_database(db_path) as con:
        first = ingest_runs(con, [run], IngestOptions(workers=1))
    once = _table_counts(db_path)
    with open_database(db_path) as con:
        second = ingest_runs(con, [run], IngestOptions(workers=2))
    assert _table_counts(db_path) == once
    assert once["runs"] == 1 and once["ranks"] == 2
    assert first.runs[0].events == second.runs[0].events == once["events"]


def test_reingest_replaces_rows_the_runs_table_no_longer_lists(db_path: Path) -> None:
    """The delete step probes every run-keyed table, not only ``runs``: orphaned rows of a run
    (its ``runs`` row deleted by hand) are replaced, not doubled."""
    run = KINETO / "sampled_2_of_128"
    with open_database(db_path) as con:
        ingest_runs(con, [run], IngestOptions(workers=1))
    once = _table_counts(db_path)
    with open_database(db_path) as con:
        con.execute("DELETE FROM runs")
        ingest_runs(con, [run], IngestOptions(workers=1))
    assert _table_counts(db_path) == once


def test_an_ingest_restores_the_connections_thread_setting(tmp_path: Path) -> None:
    """A large rank's decode inserts run on one thread (``OneThreadForLargeInserts``); the caller's
    setting is back once the run is stored."""
    with open_database(tmp_path / "threads.duckdb") as con:
        con.execute("SET threads = 2")
        ingest_runs(con, [KINETO / "dlrm_8rank"], IngestOptions(workers=1))
        assert con.execute("SELECT count(*) FROM events").fetchall() == [(19_789,)]
        assert con.execute("SELECT current_setting('threads')").fetchall() == [(2,)]


def test_many_runs_per_database_and_run_id(db_path: Path) -> None:
    trace = KINETO / "single" / "h100_bert_small_inference.json.gz"
    with open_database(db_path) as con:
        ingest_runs(con, [trace], IngestOptions(run_id="bert_a"))
        ingest_runs(con, [trace], IngestOptions(run_id="bert_b"))
        rows = con.execute("SELECT run_id, count(*) FROM events GROUP BY 1 ORDER BY 1").fetchall()
        (rank_source,) = con.execute("SELECT DISTINCT rank_source FROM ranks").fetchone()
    assert [r for r, _ in rows] == ["bert_a", "bert_b"]
    assert rows[0][1] == rows[1][1] > 0
    assert rank_source == "single_file"


def test_parallel_and_serial_ingest_store_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    query = "SELECT * EXCLUDE (run_id) FROM events ORDER BY rank, event_id"
    tables = []
    for workers in (1, 2):
        path = tmp_path / f"w{workers}.duckdb"
        with open_database(path) as con:
            ingest_runs(con, [KINETO / "sampled_2_of_128"], IngestOptions(workers=workers))
            tables.append(con.execute(query).fetchall())
    assert tables[0] == tables[1]


def test_2021_schema_fields(shared_db: Path) -> None:
    """2021 traces: string thread ids, "stream 7" GPU rows, lowercase ``Input dims``/``external id``."""
    with open_database(Path(shared_db), read_only=True) as con:
        run = "v100_resnet50_2021_schema"
        tids = con.execute(
            "SELECT count(*) FILTER (WHERE tid IS NULL), count(*) FROM events WHERE run_id = ? AND kind = 'cpu_op'",
            [run],
        ).fetchone()
        stream = con.execute(
            "SELECT DISTINCT stream, tid FROM events WHERE run_id = ? AND kind = 'kernel'", [run]
        ).fetchall()
        linked = con.execute(
            "SELECT count(*) FILTER (WHERE external_id IS NOT NULL AND input_dims IS NOT NULL), count(*) "
            "FROM events WHERE run_id = ? AND kind = 'cpu_op'",
            [run],
        ).fetchone()
        era = con.execute("SELECT schema_era FROM ranks WHERE run_id = ?", [run]).fetchone()[0]
    assert tids[0] == 0 and tids[1] > 40_000
    assert stream == [(7, None)]
    assert linked[0] == linked[1]
    assert era == "2021"


def test_collective_args_on_newest_kernels(shared_db: Path) -> None:
    with open_database(Path(shared_db), read_only=True) as con:
        rows = con.execute(
            "SELECT DISTINCT coll_name, group_size, pg_ranks, pg_desc FROM events "
            "WHERE run_id = 'a100_ddp_rank0_of_2' AND kind = 'kernel' AND coll_name IS NOT NULL"
        ).fetchall()
        process_groups = con.execute(
            "SELECT metadata_json IS NULL, world_size FROM runs WHERE run_id = 'a100_ddp_rank0_of_2'"
        ).fetchone()
    assert rows and {r[1] for r in rows} == {2}
    assert {r[2] for r in rows} == {"[0,1]"}
    assert {r[3] for r in rows} == {"default_pg"}
    assert process_groups == (True, 2)


class _NoPandas(importlib.abc.MetaPathFinder):
    """A machine without pandas: importing it fails."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_parsing_needs_no_pandas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tracecal never requires pandas: without it a run still parses."""
    monkeypatch.delitem(sys.modules, "pandas", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_NoPandas(), *sys.meta_path])
    files = discover_run(KINETO / "sampled_2_of_128").files
    parsed = [r for _, ranks in Parsing(InProcess(), files, tmp_path, "raise", []) for r in ranks]
    assert sorted(r.rank for r in parsed) == [0, 1]

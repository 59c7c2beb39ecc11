"""Parsing on Dask (``--dask``): the same tables as parsing locally, a worker that dies, Dask missing."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from tests.conftest import KINETO
from tests.test_ingest_pool import die_on, run_rows
from tracecal.cli.main import app
from tracecal.errors import WorkerError
from tracecal.ingest.discover import discover_run
from tracecal.pipeline.ingest import IngestOptions, ingest_runs
from tracecal.sql.connection import open_database

DLRM = KINETO / "dlrm_8rank"
COMPARED = ("runs", "ranks", "events", "operators", "collectives", "iterations")
VARYING = {"runs": ["ingest_seconds", "ingested_at", "events_dir"]}
"""Columns that legitimately differ between two ingests of the same runs: when, and how long it took."""

runner = CliRunner()


def _differences(a: Path, b: Path) -> dict[str, tuple[int, int]]:
    """Per table, rows of ``a`` not in ``b`` and of ``b`` not in ``a`` (EXCEPT ALL both ways), where any."""
    found = {}
    with duckdb.connect() as con:
        con.execute("SET file_search_path = ?", [f"{a.parent},{b.parent}"])  # where their events views read
        con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
        con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
        for table in COMPARED:
            varying = VARYING.get(table)
            columns = f"* EXCLUDE ({', '.join(varying)})" if varying else "*"
            only = [
                con.execute(
                    f"SELECT count(*) FROM (SELECT {columns} FROM {x}.{table} "
                    f"EXCEPT ALL SELECT {columns} FROM {y}.{table})"
                ).fetchone()[0]
                for x, y in (("a", "b"), ("b", "a"))
            ]
            if any(only):
                found[table] = (only[0], only[1])
    return found


@pytest.mark.slow
def test_dask_local_stores_the_tables_a_local_ingest_stores(
    tmp_path: Path, tiny_workload: Callable[[int, int], Path]
) -> None:
    pytest.importorskip("distributed")
    runs = [str(DLRM), str(tiny_workload(2, 64))]
    local, dask = tmp_path / "local" / "t.duckdb", tmp_path / "dask" / "t.duckdb"
    for db, flags in ((local, ["-j", "1"]), (dask, ["--dask", "local", "-j", "2"])):
        db.parent.mkdir()
        result = runner.invoke(app, ["ingest", *runs, *flags, "--db", str(db)], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
    assert _differences(local, dask) == {}
    with open_database(Path(dask), read_only=True) as con:
        assert con.execute("SELECT count(DISTINCT run_id), count(*) FROM ranks").fetchone() == (2, 10)
        assert con.execute("SELECT count(*) FROM operators").fetchone()[0] > 2244
    assert [p.name for p in dask.parent.iterdir() if p.name.startswith("tracecal-shards-")] == []


@pytest.mark.slow
def test_a_dask_worker_that_dies_is_one_error_naming_its_file_and_the_database_is_unchanged(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    import dask

    from tracecal.ingest.dask_cluster import DaskExecutor

    db = tmp_path / "t.duckdb"
    with open_database(db) as con:
        ingest_runs(con, [DLRM], IngestOptions(workers=1))
    before = run_rows(db)
    fatal = discover_run(DLRM).files[5].path
    # No retry on another worker: the first death is the task's KilledWorker (Dask retries 3 times by default).
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        client.run(die_on, fatal.name)  # in every worker process: its parse of that file ends the process
        with open_database(db) as con, pytest.raises(WorkerError) as caught:
            ingest_runs(con, [DLRM], IngestOptions(workers=2, shard_dir=tmp_path), executor=DaskExecutor(client, 2))
    message = str(caught.value)
    assert message.startswith(f"{fatal}: a parser process died") and "Dask workers more memory" in message
    assert "\n" not in message
    assert run_rows(db) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("tracecal-shards-")] == []


@pytest.mark.slow
def test_dask_local_workers_keep_glibcs_heap_thresholds_and_run_without_dasks_profiler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dask sets MALLOC_TRIM_THRESHOLD_ in its workers, which makes a streamed parse fault in fresh pages
    for every chunk, and samples every worker's stack 100 times a second; the workers of --dask local
    are spawned without either, and their event loops tick once a second."""
    pytest.importorskip("distributed")
    import os

    from tracecal.ingest.dask_cluster import dask_executor

    # as in a fresh trace-ingest: a LocalCluster made earlier in this process (another test's) leaves
    # Dask's value in the process environment, which every later worker inherits
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)

    def worker_settings(dask_worker: Any) -> tuple[str | None, bool, float]:
        return (
            os.environ.get("MALLOC_TRIM_THRESHOLD_"),
            dask_worker.periodic_callbacks.get("profile") is not None,
            dask_worker.periodic_callbacks["tick"].callback_time,
        )

    with dask_executor("local", 1) as executor:
        (settings,) = executor.client.run(worker_settings).values()
        scheduler_tick = executor.client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.periodic_callbacks["tick"].callback_time
        )
    assert settings == (None, False, 1000)
    assert scheduler_tick == 1000


def test_dask_without_dask_installed_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` now raises ImportError
    result = runner.invoke(app, ["ingest", str(DLRM), "--dask", "local", "--db", str(tmp_path / "t.duckdb")])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "pip install 'tracecal[dask]'" in line
    assert not (tmp_path / "t.duckdb").exists()  # said before anything was opened


def test_dask_tasks_get_absolute_paths_because_a_workers_directory_is_not_the_loaders() -> None:
    """A trace file (or a shard directory) given relative to the loader reaches the worker absolute."""
    from tracecal.ingest.dask_cluster import DaskExecutor
    from tracecal.ingest.discover import TraceFile

    class Client:
        submitted: tuple = ()

        def nthreads(self) -> dict[str, int]:
            return {"w": 1}

        def submit(self, fn: Callable, *args: object, pure: bool) -> None:
            self.submitted = args

    client = Client()
    relative = TraceFile(path=Path("runs/r/rank-0.json"), format="kineto", path_rank=0, size_bytes=1)
    DaskExecutor(client, 1).submit(print, relative, Path("shards"), True)
    trace_file, shard_dir, crosses = client.submitted
    assert trace_file == TraceFile(Path.cwd() / "runs/r/rank-0.json", "kineto", 0, 1)
    assert shard_dir == Path.cwd() / "shards" and crosses is True

"""The shared Nsight exports through ``tracecal ingest`` into DuckDB: events against direct SQL on the
files, ranks, NCCL SendRecv kernels in ``collectives``, operators linked to runtime calls
(correlation) and to NVTX operator ranges (time on the launching thread)."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import NSYS
from tracecal.cli.main import app
from tracecal.sql.connection import open_database

runner = CliRunner()
MFU = NSYS / "mfu_2gpu_after.sqlite.gz"
MOCK = NSYS / "mock.sqlite.gz"


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, sqlite3.Connection]:
    """Both exports copied into their own run directories and ingested into one database."""
    root = tmp_path_factory.mktemp("nsys_runs")
    for run, src in (("mfu_nsys", MFU), ("mock_nsys", MOCK)):
        (root / run).mkdir()
        shutil.copy(src, root / run / src.name)
    db = root / "t.duckdb"
    result = runner.invoke(app, ["ingest", str(root / "mfu_nsys"), str(root / "mock_nsys"), "--db", str(db), "-j", "2"])
    assert result.exit_code == 0, result.output
    raw = root / "mfu.sqlite"
    with gzip.open(MFU, "rb") as f, raw.open("wb") as g:
        shutil.copyfileobj(f, g)
    return db, sqlite3.connect(raw)


def _q(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    with open_database(Path(db), read_only=True) as con:
        return con.execute(sql, params or []).fetchall()


def test_runs_and_ranks(ingested: tuple[Path, sqlite3.Connection]) -> None:
    db, _ = ingested
    assert _q(db, "SELECT run_id, format, ranks_found FROM runs ORDER BY 1") == [
        ("mfu_nsys", "nsys", 2),
        ("mock_nsys", "nsys", 1),
    ]
    ranks = _q(db, "SELECT run_id, rank, rank_source, pid, device_name, schema_era FROM ranks ORDER BY 1, 2")
    assert ranks == [
        ("mfu_nsys", 0, "nsys_order", 148, None, "nsys-3.25.0"),
        ("mfu_nsys", 1, "nsys_order", 149, None, "nsys-3.25.0"),
        ("mock_nsys", 0, "single_file", 91186, "NVIDIA GeForce RTX 3080", "nsys-3.24.14"),
    ]


def test_event_counts_and_kernel_time_match_the_file(ingested: tuple[Path, sqlite3.Connection]) -> None:
    db, raw = ingested

    def file_count(sql: str) -> tuple:
        return raw.execute(sql).fetchone()

    def db_count(kinds: tuple[str, ...], value: str = "dur_ns") -> tuple:
        marks = ", ".join("?" for _ in kinds)
        return _q(
            db,
            f"SELECT count(*), sum({value}) FROM events WHERE run_id = 'mfu_nsys' AND kind IN ({marks})",
            list(kinds),
        )[0]

    assert db_count(("kernel",)) == file_count("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert db_count(("cuda_runtime", "cuda_driver")) == file_count(
        "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_RUNTIME"
    )
    assert db_count(("memcpy",), "bytes") == file_count("SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    assert db_count(("memset",), "bytes") == file_count("SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET")
    assert db_count(("cpu_op", "user_annotation")) == file_count(
        "SELECT count(*), sum(end - start) FROM NVTX_EVENTS WHERE eventType IN (59, 60)"
    )
    mock = _q(db, "SELECT count(*), sum(dur_ns) FROM events WHERE run_id = 'mock_nsys' AND kind = 'kernel'")
    assert mock == [(2, (1517728492 - 1517727052) + (1535981719 - 1535979030))]


def test_sendrecv_kernels_are_collectives(ingested: tuple[Path, sqlite3.Connection]) -> None:
    db, raw = ingested
    in_file = raw.execute(
        "SELECT (k.globalPid >> 24) & 16777215, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName WHERE s.value LIKE 'ncclDevKernel_SendRecv%' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    stored = _q(
        db,
        "SELECT c.rank, count(*) FROM collectives c JOIN events e USING (run_id, rank, event_id) "
        "WHERE c.run_id = 'mfu_nsys' AND e.name LIKE 'ncclDevKernel_SendRecv%' GROUP BY 1 ORDER BY 1",
    )
    assert [n for _, n in stored] == [n for _, n in in_file] == [31, 31]
    # the instances are matched across the two ranks
    matched = _q(
        db, "SELECT count(DISTINCT match_id) FROM collectives WHERE run_id = 'mfu_nsys' AND match_id IS NOT NULL"
    )
    assert matched[0][0] >= 30


def test_operators_linked_through_correlation_and_nvtx(ingested: tuple[Path, sqlite3.Connection]) -> None:
    db, _ = ingested
    rows = _q(
        db,
        "SELECT rank, sum(dur_ns) FILTER (WHERE runtime_event_id IS NOT NULL) / sum(dur_ns), "
        "sum(dur_ns) FILTER (WHERE cpu_op_event_id IS NOT NULL) / sum(dur_ns) "
        "FROM operators WHERE run_id = 'mfu_nsys' AND kind = 'kernel' GROUP BY 1 ORDER BY 1",
    )
    for _rank, via_runtime, via_nvtx in rows:
        # measured: 99.83 % of kernel time on both ranks (the 300 ms trim cuts a few launches)
        assert via_runtime > 0.99 and via_nvtx > 0.99
    # the runtime call really shares the kernel's correlation id, and the CPU operator is an NVTX range
    # enclosing the call on the same thread
    bad = _q(
        db,
        "SELECT count(*) FROM operators o "
        "JOIN events r ON r.run_id = o.run_id AND r.rank = o.rank AND r.event_id = o.runtime_event_id "
        "JOIN events c ON c.run_id = o.run_id AND c.rank = o.rank AND c.event_id = o.cpu_op_event_id "
        "WHERE o.run_id = 'mfu_nsys' AND (r.correlation <> o.correlation OR c.category <> 'NVTX_EVENTS' "
        "OR c.tid <> r.tid OR r.ts_ns < c.ts_ns OR r.ts_ns >= c.ts_ns + c.dur_ns)",
    )
    assert bad == [(0,)]
    gemm = _q(
        db,
        "SELECT count(*) FROM operators WHERE run_id = 'mfu_nsys' AND family = 'gemm' AND cpu_op_name = 'aten::addmm'",
    )
    assert gemm[0][0] > 0


def test_parser_warnings_reach_the_cli(tmp_path: Path) -> None:
    run = tmp_path / "mock_only"
    run.mkdir()
    shutil.copy(MOCK, run / MOCK.name)
    result = runner.invoke(app, ["ingest", str(run), "--db", str(tmp_path / "w.duckdb"), "-j", "1"])
    assert result.exit_code == 0, result.output
    assert "mock.sqlite.gz: no NVTX ranges" in result.output

"""Nsight reader on the two real shared exports, checked against direct SQL on the files."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import NSYS
from tracecal.ingest.trace import ParsedRank
from tracecal.schema import EVENTS, arrow_schema
from tracecal.sources.nsys.parser import parse_nsys_file

MFU = NSYS / "mfu_2gpu_after.sqlite.gz"
MOCK = NSYS / "mock.sqlite.gz"


def _unzipped(src: Path, tmp: Path) -> Path:
    out = tmp / src.name[: -len(".gz")]
    with gzip.open(src, "rb") as f, out.open("wb") as g:
        shutil.copyfileobj(f, g)
    return out


@pytest.fixture(scope="module")
def mfu_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    con = sqlite3.connect(_unzipped(MFU, tmp_path_factory.mktemp("mfu")))
    yield con
    con.close()


@pytest.fixture(scope="module")
def mfu() -> list[ParsedRank]:
    return parse_nsys_file(MFU)


_PID_OF = "(({col} >> 24) & 16777215) = ?"
PER_PROCESS = {
    "kernel": "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE "
    + _PID_OF.format(col="globalPid"),
    "memcpy": "SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE " + _PID_OF.format(col="globalPid"),
    "memset": "SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE " + _PID_OF.format(col="globalPid"),
    "runtime": "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE "
    + _PID_OF.format(col="globalTid"),
    "sync": "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE "
    + _PID_OF.format(col="globalPid"),
    "nvtx": "SELECT count(*), sum(end - start) FROM NVTX_EVENTS WHERE eventType = 59 AND "
    + _PID_OF.format(col="globalTid"),
}


def _stats(events: pa.Table, kinds: list[str], value: str) -> tuple[int, int]:
    sel = events.filter(pc.is_in(events.column("kind"), pa.array(kinds)))
    return sel.num_rows, pc.sum(sel.column(value)).as_py()


def test_two_ranks_in_the_two_gpu_export(mfu: list[ParsedRank]) -> None:
    assert [(r.rank, r.rank_source, r.pid) for r in mfu] == [(0, "nsys_order", 148), (1, "nsys_order", 149)]
    assert [r.metadata["nsys_devices"] for r in mfu] == [[0], [1]]
    for r in mfu:
        assert (r.format, r.schema_era, r.host, r.backend) == ("nsys", "nsys-3.25.0", "modal", "nccl")
        assert r.device_name is None  # the trimmed export has no TARGET_INFO_GPU
        assert r.events.schema == arrow_schema(EVENTS)
        assert r.events.column("event_id").to_pylist() == list(range(r.events.num_rows))
        assert set(r.events.column("rank").to_pylist()) == {r.rank}
        assert r.metadata["warnings"] == []


def test_counts_and_kernel_time_match_direct_sql(mfu: list[ParsedRank], mfu_db: sqlite3.Connection) -> None:
    for r in mfu:
        ev = r.events
        q = {k: mfu_db.execute(sql, (r.pid,)).fetchone() for k, sql in PER_PROCESS.items()}
        assert _stats(ev, ["kernel"], "dur_ns") == q["kernel"]
        assert _stats(ev, ["memcpy"], "bytes") == q["memcpy"]
        assert _stats(ev, ["memset"], "bytes") == q["memset"]
        assert _stats(ev, ["cuda_runtime", "cuda_driver"], "dur_ns") == q["runtime"]
        assert _stats(ev, ["sync"], "dur_ns") == q["sync"]
        assert _stats(ev, ["cpu_op", "user_annotation"], "dur_ns") == q["nvtx"]
    # the file's totals are split between the ranks, nothing lost or duplicated
    total = mfu_db.execute("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    assert tuple(map(sum, zip(*(_stats(r.events, ["kernel"], "dur_ns") for r in mfu), strict=True))) == total
    assert sum(r.events.num_rows for r in mfu) == 3587 + 904 + 242 + 6682 + 334 + 17113


def test_timestamps_are_utc_epoch_ns(mfu: list[ParsedRank], mfu_db: sqlite3.Connection) -> None:
    utc, clock = mfu_db.execute("SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    first = mfu_db.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0").fetchone()[0]
    kernels = mfu[0].events.filter(pc.equal(mfu[0].events.column("kind"), "kernel"))
    assert pc.min(kernels.column("ts_ns")).as_py() == first - clock + utc
    assert mfu[0].metadata["nsys_utc_offset_ns"] == utc - clock


def test_kernels_link_to_runtime_calls_by_correlation(mfu: list[ParsedRank], mfu_db: sqlite3.Connection) -> None:
    for r in mfu:
        ev = r.events.to_pylist()
        launches = {e["correlation"] for e in ev if e["kind"] in ("cuda_runtime", "cuda_driver")}
        kernels = [e for e in ev if e["kind"] == "kernel"]
        linked = sum(e["correlation"] in launches for e in kernels)
        expected = mfu_db.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE (k.globalPid >> 24) & 16777215 = ? AND EXISTS "
            "(SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId "
            "AND (r.globalTid >> 24) & 16777215 = ?)",
            (r.pid, r.pid),
        ).fetchone()[0]
        assert linked == expected
        assert linked / len(kernels) > 0.99  # the 300 ms trim cut a handful of launches


def test_emit_nvtx_operators_and_nccl_ranges(mfu: list[ParsedRank], mfu_db: sqlite3.Connection) -> None:
    aten = mfu_db.execute(
        "SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'aten::%' AND (globalTid >> 24) & 16777215 = 148"
    ).fetchone()[0]
    ev = mfu[0].events.to_pylist()
    ops = [e for e in ev if e["kind"] == "cpu_op"]
    assert sum(e["name"].startswith("aten::") for e in ops) == aten
    mul = next(e for e in ops if e["name"] == "aten::mul" and e["sequence_number"] is not None)
    assert mul["category"] == "NVTX_EVENTS" and mul["tid"] == 148
    # NCCL ranges live in domain 1 as textId strings; send/recv carry the collective name
    colls = [e["coll_name"] for e in ev if e["kind"] == "user_annotation" and e["coll_name"]]
    assert colls.count("send") == 60 and colls.count("recv") == 60
    scopes = {e["name"] for e in ev if e["kind"] == "user_annotation"}
    assert "ncclGroupEnd" in scopes
    assert any(s.startswith("FSDP::pre_forward (blocks.") for s in scopes)
    nccl_kernels = [e for e in ev if e["kind"] == "kernel" and e["name"].startswith("ncclDevKernel_SendRecv")]
    assert len(nccl_kernels) == 31


def test_runtime_names_lose_the_api_version_suffix(mfu: list[ParsedRank]) -> None:
    names = set(pc.unique(mfu[0].events.filter(pc.equal(mfu[0].events.column("kind"), "cuda_runtime"))
                          .column("name")).to_pylist())  # fmt: skip
    assert {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamGetCaptureInfo_v2"} <= names
    assert not any(n.endswith(("_v7000", "_v3020")) for n in names)


def test_mock_export_single_rank_with_gpu_name() -> None:
    (rank,) = parse_nsys_file(MOCK)
    assert rank.rank is None and rank.rank_source == "nsys_order"
    assert rank.device_name == "NVIDIA GeForce RTX 3080"
    assert rank.schema_era == "nsys-3.24.14"
    kinds = rank.events.column("kind").to_pylist()
    assert (kinds.count("kernel"), kinds.count("memcpy"), kinds.count("sync")) == (2, 1, 1)
    assert kinds.count("cuda_runtime") + kinds.count("cuda_driver") == 9
    assert _stats(rank.events, ["kernel"], "dur_ns") == (2, (1517728492 - 1517727052) + (1535981719 - 1535979030))
    assert any("no NVTX ranges" in w for w in rank.metadata["warnings"])

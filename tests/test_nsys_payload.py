"""Rank evidence from NCCL typed NVTX payloads, on blobs built in code (the shared exports have none)."""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

from tests.test_nsys_tiny import gtid, make_export, one_step
from tracecal.sources.nsys.export import open_export
from tracecal.sources.nsys.parser import parse_nsys_file
from tracecal.sources.nsys.payload import HEADER, decode_payload, nccl_ranks, payload_schemas

INIT_SCHEMA = 16777218  # the id ncclCommInitRank's schema has in the shared export
# (name, NVTX entry type, offset): as NVTX_PAYLOAD_SCHEMA_ENTRIES lists them in the shared export
INIT_ENTRIES = [("NCCL communicator ID", 18, None), ("No. of ranks", 5, 8), ("Rank", 5, 12), ("CUDA device", 5, 16)]


def init_blob(comm: int, nranks: int, rank: int, device: int, *, schema: int = INIT_SCHEMA) -> bytes:
    payload = struct.pack("<Qiii", comm, nranks, rank, device) + b"\x00" * 4
    return HEADER.pack(1, 0, schema, 0, len(payload), HEADER.size + len(payload)) + payload


P2P_SCHEMA = 16777226  # ncclSend / ncclRecv in the shared export
P2P_ENTRIES = [("NCCL communicator ID", 18, None), ("Message size [bytes]", 22, 8), ("Peer rank", 5, 16)]


def p2p_blob(comm: int, size: int, peer: int) -> bytes:
    payload = struct.pack("<QQi", comm, size, peer) + b"\x00" * 4
    return HEADER.pack(1, 0, P2P_SCHEMA, 0, len(payload), HEADER.size + len(payload)) + payload


def add_payloads(path: Path, rows: list[tuple[int, int, bytes]], name: str = "ncclCommInitRank") -> None:
    """Declare the init and p2p schemas (once) and add one ``name`` range per (pid, start, blob)."""
    con = sqlite3.connect(path)
    if con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'NVTX_PAYLOAD_SCHEMAS'").fetchone()[0]:
        _add_ranges(con, rows, name)
        return
    con.execute(
        "CREATE TABLE NVTX_PAYLOAD_SCHEMAS (domainId INT, schemaId INT, name TEXT, type INT, flags INT, "
        "numEntries INT, payloadSize INT, alignTo INT)"
    )
    con.execute("INSERT INTO NVTX_PAYLOAD_SCHEMAS VALUES (1, ?, NULL, 1, NULL, 4, 24, NULL)", (INIT_SCHEMA,))
    con.execute(
        "CREATE TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId INT, schemaId INT, idx INT, flags INT, type INT, "
        "name TEXT, description TEXT, arrayOrUnionDetail INT, offset INT)"
    )
    con.execute("INSERT INTO NVTX_PAYLOAD_SCHEMAS VALUES (1, ?, NULL, 1, NULL, 3, 24, NULL)", (P2P_SCHEMA,))
    for schema, entries in ((INIT_SCHEMA, INIT_ENTRIES), (P2P_SCHEMA, P2P_ENTRIES)):
        for i, (entry, typ, off) in enumerate(entries):
            con.execute(
                "INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES VALUES (1, ?, ?, NULL, ?, ?, NULL, NULL, ?)",
                (schema, i, typ, entry, off),
            )
    _add_ranges(con, rows, name)


def _add_ranges(con: sqlite3.Connection, rows: list[tuple[int, int, bytes]], name: str) -> None:
    for pid, start, blob in rows:
        con.execute(
            "INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, NULL, NULL, 1, ?)",
            (start, start + 5, name, gtid(pid, pid), blob),
        )
    con.commit()
    con.close()


def two_processes(tmp_path: Path) -> Path:
    a, b = one_step(pid=30, device=0, corr=1), one_step(pid=20, device=1, corr=1)
    return make_export(tmp_path / "r.sqlite", **{k: a[k] + b[k] for k in a})


def test_decode_payload_reads_entries_at_their_offsets(tmp_path: Path) -> None:
    path = two_processes(tmp_path)
    add_payloads(path, [])
    with open_export(path) as export:
        schemas = payload_schemas(export)
    values = decode_payload(init_blob(0xABCDEF, 8, 5, 1), schemas)
    assert values == {"NCCL communicator ID": 0xABCDEF, "No. of ranks": 8, "Rank": 5, "CUDA device": 1}
    assert decode_payload(init_blob(1, 8, 5, 1, schema=999), schemas) is None  # undeclared schema
    assert decode_payload(init_blob(1, 8, 5, 1)[:40], schemas) is None  # truncated
    assert decode_payload(b"\x00" * 8, schemas) is None


def test_nccl_rank_overrides_process_order(tmp_path: Path) -> None:
    path = two_processes(tmp_path)
    # pid 30 runs device 0 (ordinal 0) but NCCL says it is rank 3 of 4; a later 2-rank subgroup is ignored
    add_payloads(
        path,
        [(30, 10, init_blob(7, 4, 3, 0)), (20, 11, init_blob(7, 4, 2, 1)), (30, 20, init_blob(9, 2, 0, 0))],
    )
    ranks = parse_nsys_file(path)
    assert [(r.pid, r.rank, r.rank_source, r.world_size) for r in ranks] == [
        (30, 3, "nvtx_nccl", 4),
        (20, 2, "nvtx_nccl", 4),
    ]


def test_conflicting_payload_ranks_fall_back_to_order(tmp_path: Path) -> None:
    path = two_processes(tmp_path)
    add_payloads(path, [(30, 10, init_blob(7, 4, 1, 0)), (20, 11, init_blob(7, 4, 1, 1))])
    with open_export(path) as export:
        assert nccl_ranks(export) == {}
    assert [(r.rank, r.rank_source) for r in parse_nsys_file(path)] == [(0, "nsys_order"), (1, "nsys_order")]


def test_nccl_ranges_carry_payload_fields(tmp_path: Path) -> None:
    path = two_processes(tmp_path)
    add_payloads(path, [(30, 10, init_blob(7, 4, 3, 0)), (30, 12, init_blob(9, 2, 1, 0))])
    add_payloads(path, [(30, 300, p2p_blob(7, 4096, 1))], name="ncclSend")
    add_payloads(path, [(30, 310, p2p_blob(9, 512, 0))], name="ncclRecv")
    add_payloads(path, [(30, 320, None)], name="ncclSend")  # a range without payload keeps nulls
    rank = next(r for r in parse_nsys_file(path) if r.pid == 30)
    rows = [e for e in rank.events.to_pylist() if e["name"] in ("ncclSend", "ncclRecv")]
    got = [(e["coll_name"], e["pg_name"], e["group_size"], e["bytes"], e["dst_rank"], e["src_rank"]) for e in rows]
    assert got == [
        ("send", "nccl_comm:7", 4, 4096, 1, None),
        ("recv", "nccl_comm:9", 2, 512, None, None),  # peer rank 0 of a 2-rank sub-communicator: not global
        ("send", None, None, None, None, None),
    ]


def test_partial_nccl_evidence_falls_back_to_order(tmp_path: Path) -> None:
    path = two_processes(tmp_path)
    add_payloads(path, [(30, 10, init_blob(7, 4, 1, 0))])  # pid 20 (ordinal 1) has no payload
    ranks = parse_nsys_file(path)
    assert [(r.pid, r.rank, r.rank_source) for r in ranks] == [(30, 0, "nsys_order"), (20, 1, "nsys_order")]
    assert any("cover only some processes" in w for w in ranks[0].metadata["warnings"])

"""NCCL's typed NVTX payloads: rank evidence (``ncclCommInitRank``) and collective fields of NCCL ranges.

NCCL 2.19+ annotates its API calls with NVTX ranges carrying a typed payload; the payload's layout
is declared in ``NVTX_PAYLOAD_SCHEMAS`` / ``NVTX_PAYLOAD_SCHEMA_ENTRIES`` (entry name, type, byte
offset) and the values of each range are in ``NVTX_EVENTS.binaryData`` — only when the report was
exported with ``--include-blobs=true``. The blob starts with a 32-byte header (little-endian: domain id
u32, reserved u32, schema id u32, reserved u32, payload size u64, total size u64) followed by the
payload; a blob is used only when its schema id is declared and its sizes agree with the schema, so a
different layout is ignored rather than misread.

Note: the shared exports were made without blobs, so this path is exercised by tests on blobs built in
code only (see tests/test_nsys_payload.py); on real exports without blobs it finds nothing and ranks
fall back to the documented process order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tracecal.sources.nsys.export import Export

HEADER = struct.Struct("<IIIIQQ")
ENTRY_FORMATS = {5: "<i", 6: "<I", 15: "<i", 16: "<I", 17: "<q", 18: "<Q", 22: "<Q"}
"""NVTX payload entry types -> struct formats (int, unsigned, int32, uint32, int64, uint64, size_t)."""

RANK_FIELD = "Rank"
NRANKS_FIELD = "No. of ranks"


@dataclass(frozen=True)
class NcclRank:
    """A process's global rank as NCCL reported it: its rank in its largest communicator."""

    rank: int
    world_size: int


@dataclass(frozen=True)
class _Schema:
    payload_size: int
    fields: dict[str, tuple[int, int]]  # name -> (type, byte offset in the payload)


def payload_schemas(export: Export) -> dict[int, _Schema]:
    """Schema id -> payload size and integer entries, from ``NVTX_PAYLOAD_SCHEMA[_ENTRIES]`` ({} when absent)."""
    if not {"NVTX_PAYLOAD_SCHEMAS", "NVTX_PAYLOAD_SCHEMA_ENTRIES"} <= export.tables:
        return {}
    sizes: dict[int, int] = {}
    for sid, size in export.con.execute("SELECT schemaId, payloadSize FROM NVTX_PAYLOAD_SCHEMAS"):
        if sid is not None and size is not None:
            sizes[int(sid)] = int(size)
    fields: dict[int, dict[str, tuple[int, int]]] = {}
    rows = export.con.execute('SELECT schemaId, name, "type", "offset" FROM NVTX_PAYLOAD_SCHEMA_ENTRIES')
    for sid, name, typ, off in rows:
        if sid is None or name is None or typ is None:
            continue
        # The first entry's offset is stored as NULL: it starts the payload.
        fields.setdefault(int(sid), {})[str(name)] = (int(typ), int(off or 0))
    return {sid: _Schema(sizes[sid], f) for sid, f in fields.items() if sid in sizes}


def decode_payload(blob: bytes, schemas: dict[int, _Schema]) -> dict[str, int] | None:
    """Decode one ``binaryData`` blob into {entry name: integer value}, or None when it does not fit.

    Only integer entries are decoded (enough for ranks, sizes, communicator ids).
    """
    if blob is None or len(blob) < HEADER.size:
        return None
    _domain, _r1, schema_id, _r2, payload_size, total_size = HEADER.unpack_from(blob, 0)
    schema = schemas.get(schema_id)
    if schema is None or payload_size != schema.payload_size or total_size != HEADER.size + payload_size:
        return None
    if len(blob) < total_size:
        return None
    values: dict[str, int] = {}
    for name, (typ, off) in schema.fields.items():
        fmt = ENTRY_FORMATS.get(typ)
        if fmt is None or off + struct.calcsize(fmt) > payload_size:
            continue
        values[name] = struct.unpack_from(fmt, blob, HEADER.size + off)[0]
    return values


def nccl_ranks(export: Export) -> dict[int, NcclRank]:
    """Process id -> its NCCL global rank, from ``ncclCommInitRank`` payloads when the export has them.

    The communicator with the most ranks is taken as the world (the default process group is created
    first and spans every rank); ties go to the earliest. Returns {} when the evidence is absent or
    inconsistent (two processes claiming one rank, a rank outside its communicator).
    """
    if "NVTX_EVENTS" not in export.tables or "binaryData" not in export.columns("NVTX_EVENTS"):
        return {}
    schemas = {sid: s for sid, s in payload_schemas(export).items() if {RANK_FIELD, NRANKS_FIELD} <= set(s.fields)}
    if not schemas:
        return {}
    best: dict[int, NcclRank] = {}
    rows = export.con.execute(
        "SELECT (globalTid >> 24) & 16777215, binaryData FROM NVTX_EVENTS "
        "WHERE binaryData IS NOT NULL AND globalTid IS NOT NULL ORDER BY start"
    )
    for proc, blob in rows:
        values = decode_payload(bytes(blob), schemas)
        if values is None or RANK_FIELD not in values or NRANKS_FIELD not in values:
            continue
        found = NcclRank(rank=int(values[RANK_FIELD]), world_size=int(values[NRANKS_FIELD]))
        if not 0 <= found.rank < found.world_size:
            return {}
        current = best.get(int(proc))
        if current is None or found.world_size > current.world_size:
            best[int(proc)] = found
    ranks = [r.rank for r in best.values()]
    if len(ranks) != len(set(ranks)):
        return {}
    return best


COMM_FIELD = "NCCL communicator ID"
SIZE_FIELD = "Message size [bytes]"
PEER_FIELD = "Peer rank"


def nccl_range_fields(
    names: list[str | None], blobs: list[bytes | None], schemas: dict[int, _Schema]
) -> dict[str, list[int | str | None]]:
    """Collective fields of NCCL NVTX ranges from their payloads (pure).

    Args:
        names: each range's name (``ncclSend``, ``ncclAllReduce``, ``ncclCommInitRank``, ...).
        blobs: each range's ``binaryData`` (None when absent).
        schemas: ``payload_schemas(export)``.

    Returns:
        Lists aligned with ``names``: ``pg_name`` (``nccl_comm:<communicator id, hex>``, the same on every
        member rank), ``group_size`` (the communicator's ranks, from its ``ncclCommInitRank`` payload in
        the same export), ``bytes`` (``Message size [bytes]``), ``dst_rank`` / ``src_rank`` (the peer of
        an ``ncclSend`` / ``ncclRecv``, only in the largest communicator, whose ranks are global).
    """
    decoded = [decode_payload(b, schemas) if b is not None else None for b in blobs]
    comm_size: dict[int, int] = {}
    for values in decoded:
        if values and COMM_FIELD in values and NRANKS_FIELD in values:
            comm_size[values[COMM_FIELD]] = values[NRANKS_FIELD]
    world = max(comm_size.values(), default=None)
    out: dict[str, list[int | str | None]] = {k: [None] * len(names) for k in ("pg_name", "group_size", "bytes",
                                                                             "dst_rank", "src_rank")}  # fmt: skip
    for i, (name, values) in enumerate(zip(names, decoded, strict=True)):
        if not values or COMM_FIELD not in values:
            continue
        comm = values[COMM_FIELD]
        out["pg_name"][i] = f"nccl_comm:{comm:x}"
        out["group_size"][i] = comm_size.get(comm)
        out["bytes"][i] = values.get(SIZE_FIELD)
        peer = values.get(PEER_FIELD)
        if peer is not None and world is not None and comm_size.get(comm) == world:
            if name == "ncclSend":
                out["dst_rank"][i] = peer
            elif name == "ncclRecv":
                out["src_rank"][i] = peer
    return out

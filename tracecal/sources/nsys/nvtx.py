"""NVTX range texts -> event kind, operator name, sequence number, input shapes, collective name.

A pure, vectorised transform (``pyarrow.compute`` regexes run in C++, no Python loop per range):

- ``torch.autograd.profiler.emit_nvtx`` writes one range per operator as
  ``aten::mm, seq = 12, op_id = 40, sizes = [[8, 512], [512, 1024]], input_op_ids = [(39, 0)]``
  (``seq``, ``sizes`` and ``input_op_ids`` optional). These become kind ``cpu_op`` named ``aten::mm``
  with ``sequence_number`` 12 and ``input_dims`` ``[[8,512],[512,1024]]`` (compact JSON, like Kineto's).
- ``record_function`` scopes are emitted the same way (``ProfilerStep#3, op_id = 7``,
  ``FSDP::pre_forward (blocks.9...), op_id = 9``). Kineto calls them ``user_annotation``; NVTX does not
  record the scope, so a name containing ``#`` or white space is taken as a user scope. Aten ops and
  autograd nodes never contain either.
- NCCL's own ranges (``ncclAllReduce``, ``ncclSend``, ``ncclGroupEnd``, ...) become ``user_annotation``
  with ``coll_name`` set for the collectives and point-to-point calls (``allreduce``, ``send``, ...).
- Every other range is a ``user_annotation`` named by its full text, so ``ProfilerStep``-like markers
  of any framework work as iteration markers.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

EMIT_NVTX_PATTERN = (
    r"^(?P<name>[^,]+?)(?:, seq = (?P<seq>-?\d+))?(?:, op_id = (?P<op_id>\d+))?"
    r"(?:, sizes = (?P<sizes>\[.*?\]))?(?:, input_op_ids = (?P<inputs>.*))?$"
)
"""torch ``getNvtxStr`` format; groups that did not participate come back as empty strings."""

USER_SCOPE_PATTERN = r"[#\s]"
"""A ``record_function`` scope rather than an operator: ``ProfilerStep#3``, ``FSDP::pre_forward (x)``."""

NCCL_COLLECTIVES: dict[str, str] = {
    "ncclAllReduce": "allreduce",
    "ncclAllGather": "allgather",
    "ncclReduceScatter": "reduce_scatter",
    "ncclBroadcast": "broadcast",
    "ncclBcast": "broadcast",
    "ncclReduce": "reduce",
    "ncclSend": "send",
    "ncclRecv": "recv",
    "ncclAlltoAll": "all_to_all",
    "ncclAllToAll": "all_to_all",
    "ncclGather": "gather",
    "ncclScatter": "scatter",
}
"""NCCL API ranges that move data, and the collective name stored in ``events.coll_name`` (the
names ``record_param_comms`` uses in Kineto traces). ``ncclGroupStart``/``End``, ``ncclCommInitRank``
and the like are kept as plain annotations."""

NVTX_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("name", pa.string()),
        ("sequence_number", pa.int64()),
        ("input_dims", pa.string()),
        ("coll_name", pa.string()),
    ]
)


def _nonempty(arr: pa.Array) -> pa.Array:
    """Empty strings (non-participating regex groups) -> null."""
    return pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.string()), arr)


def classify_nvtx(text: pa.Array | pa.ChunkedArray) -> pa.Table:
    """Classify NVTX range texts.

    Args:
        text: one string per range (``NVTX_EVENTS.text`` or the ``textId`` string); null allowed.

    Returns:
        A table with ``NVTX_SCHEMA``, one row per input row: ``kind`` (``cpu_op`` or
        ``user_annotation``), ``name``, ``sequence_number`` (null when absent or -1), ``input_dims``
        (compact JSON text or null) and ``coll_name`` (null unless an NCCL data-moving call).
    """
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks() if text.num_chunks else pa.array([], pa.string())
    text = text.cast(pa.string())
    n = len(text)
    if n == 0:
        return NVTX_SCHEMA.empty_table()
    parsed = pc.extract_regex(pc.fill_null(text, ""), EMIT_NVTX_PATTERN)
    # extract_regex yields null for rows that do not match (e.g. names containing ", ").
    matched = pc.is_valid(parsed)
    op_name = pc.struct_field(parsed, "name")
    seq = _nonempty(pc.struct_field(parsed, "seq"))
    op_id = _nonempty(pc.struct_field(parsed, "op_id"))
    sizes = _nonempty(pc.struct_field(parsed, "sizes"))
    emitted = pc.and_(
        pc.fill_null(matched, False),
        pc.or_(pc.or_(pc.is_valid(seq), pc.is_valid(op_id)), pc.is_valid(sizes)),
    )
    emitted = pc.fill_null(emitted, False)
    name = pc.if_else(emitted, op_name, text)
    user_scope = pc.fill_null(pc.match_substring_regex(name, USER_SCOPE_PATTERN), False)
    is_nccl = pc.fill_null(pc.starts_with(name, "nccl"), False)
    is_op = pc.and_(emitted, pc.invert(pc.or_(user_scope, is_nccl)))
    kind = pc.if_else(is_op, "cpu_op", "user_annotation")

    seq_int = pc.cast(pc.if_else(emitted, seq, pa.scalar(None, pa.string())), pa.int64())
    # torch writes seq = -1 for operators outside autograd; Kineto stores no sequence number for them.
    seq_int = pc.if_else(pc.less(seq_int, 0), pa.scalar(None, pa.int64()), seq_int)
    dims = pc.if_else(emitted, pc.replace_substring(sizes, " ", ""), pa.scalar(None, pa.string()))

    nccl_keys = pa.array(list(NCCL_COLLECTIVES), pa.string())
    nccl_vals = pa.array(list(NCCL_COLLECTIVES.values()), pa.string())
    idx = pc.index_in(name, value_set=nccl_keys)
    coll = pc.take(nccl_vals, idx)
    return pa.table([kind, name, seq_int, dims, coll], schema=NVTX_SCHEMA)

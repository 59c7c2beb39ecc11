"""Nsight Systems exports -> ``ParsedRank`` objects, the same hand-over the Kineto parser makes.

``parse_nsys_file(path)`` reads one ``.sqlite`` / ``.sqlite.gz`` / ``.nsys-rep`` export (see
``export``), maps its tables into ``events`` rows with the Kineto kinds and units
(``tables``, ``nvtx``) and splits the file into ranks.

Ranks. One export may hold several processes and GPUs (``torchrun`` under one ``nsys profile``), or
one process per file (``nsys profile -o rank%q{RANK}``). A *rank* is a process that ran GPU activity
(kernel, memcpy or memset); when the export has no GPU activity at all, every process with CUDA API
calls or NVTX ranges is one. Events of other processes (launchers, shells) are dropped and counted in
the warnings. The rank number comes from, in order:

1. NCCL's ``ncclCommInitRank`` NVTX payload (``Rank`` in the communicator with the most ranks) when
   the export was made with payload blobs and it covers every rank process of the file:
   ``rank_source = 'nvtx_nccl'``;
2. otherwise a deterministic order: processes sorted by (lowest CUDA device used, pid); the file's
   n-th process gets ordinal n. A file with several such processes returns ``rank = ordinal``
   (``rank_source = 'nsys_order'``); a file with a single process returns ``rank = None`` so that
   discovery numbers it from the path like a Kineto file (``rank3.sqlite``), and two one-rank files
   never both claim rank 0 by order alone. ``metadata['nsys_ordinal']`` and
   ``metadata['nsys_ranks_in_file']`` carry the ordinal for a loader that wants to offset it.

Times. Nsight stores raw monotonic-clock nanoseconds; when the export has
``TARGET_INFO_SESSION_START_TIME`` they are shifted to UTC epoch nanoseconds (``utcEpochNs -
systemClockNs``, recorded in ``metadata['nsys_utc_offset_ns']``) so exports from different nodes
start roughly aligned, like Kineto's epoch-based timestamps. Durations are unchanged.

There are no External ids in Nsight: the CPU operator of a runtime call is the innermost enclosing
``cpu_op`` NVTX range on the same thread, and a kernel's runtime call shares its ``correlation``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracecal.errors import TraceFormatError
from tracecal.ingest.trace import ParsedRank
from tracecal.schema import EVENTS, arrow_schema
from tracecal.sources.nsys import tables
from tracecal.sources.nsys.export import Export, open_export
from tracecal.sources.nsys.payload import nccl_ranks
from tracecal.vocabulary import GPU_ACTIVITY_KINDS

EVENTS_SCHEMA = arrow_schema(EVENTS)


def parse_nsys_file(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
    """Parse one Nsight Systems export into one ``ParsedRank`` per rank it holds.

    Args:
        path: ``*.sqlite``, ``*.sqlite.gz`` or ``*.nsys-rep``.
        spill_dir: unused (the reader's signature in ``tracecal.sources.registry``): an export's ranks
            are read from SQLite into memory whole.

    Returns:
        Ranks in ordinal order; each ``events`` table conforms to ``schema.EVENTS`` with ``run_id``
        null, ``rank`` filled when known, ``event_id`` = position after sorting by (ts_ns, -dur_ns).
        ``metadata['warnings']`` lists what was missing or skipped (one line each, for the CLI).

    Raises:
        InputNotFoundError: ``path`` does not exist.
        TraceFormatError: not an Nsight export, unsupported schema, missing required columns, an
            ``.nsys-rep`` without ``nsys``, or an export with no usable events at all.
    """
    path = Path(path)
    with open_export(path) as export:
        return _parse(export, path)


def _utc_offset(export: Export) -> int | None:
    if "TARGET_INFO_SESSION_START_TIME" not in export.tables:
        return None
    cols = export.columns("TARGET_INFO_SESSION_START_TIME")
    if "utcEpochNs" not in cols or "systemClockNs" not in cols:
        return None
    row = export.con.execute("SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    if row is None or row[0] is None or row[1] is None:
        return None
    normalized = export.export_meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true"
    # A normalised export already counts from the session start.
    return int(row[0]) - (0 if normalized else int(row[1]))


def _read_all(export: Export, offset: int, warnings: list[str]) -> pa.Table:
    strings = tables.Strings.load(export)
    parts = {t: reader(export, offset, strings) for t, reader in tables.READERS.items() if t in export.tables}
    if tables.SYNC in parts:
        gpu = [parts[t] for t in tables.GPU_TABLES if t in parts]
        parts[tables.SYNC] = _resolve_sync_devices(parts[tables.SYNC], gpu)
    if tables.KERNEL not in export.tables:
        warnings.append(
            f"{export.path}: no {tables.KERNEL} table (capture without CUDA kernel trace; profile with "
            "`nsys profile --trace=cuda,nvtx`): ingesting the other events only"
        )
    if tables.NVTX not in export.tables:
        warnings.append(
            f"{export.path}: no NVTX ranges (no emit_nvtx / NCCL annotations): kernels cannot be linked to "
            "CPU operators"
        )
    if not parts:
        return tables.ROW_SCHEMA.empty_table()
    return pa.concat_tables(list(parts.values()))


def _resolve_sync_devices(sync: pa.Table, gpu: list[pa.Table]) -> pa.Table:
    """Fill ``device``/``pid`` of sync records from the (process, context) -> device map of GPU
    activity (the lowest device seen in that context; NULL where the record's process or context is
    NULL or has no GPU activity)."""
    if not gpu or sync.num_rows == 0:
        return sync
    pairs = pa.concat_tables([p.select(["proc", "context", "device"]) for p in gpu])
    proc, context, device = _int_columns(pairs, ["proc", "context", "device"])
    sync_proc, sync_context = _int_columns(sync, ["proc", "context"])
    resolved = np.zeros(sync.num_rows, dtype=np.int64)
    unresolved = np.ones(sync.num_rows, dtype=bool)
    for (p, c), d in _first_of_each(np.stack([proc, context, device], axis=1), key_width=2):
        if p != _NULL_INT and c != _NULL_INT and d != _NULL_INT:
            here = (sync_proc == p) & (sync_context == c)
            resolved[here], unresolved[here] = d, False
    devices = pa.array(resolved, pa.int64(), mask=unresolved)
    sync = sync.set_column(sync.schema.get_field_index("device"), "device", pc.cast(devices, pa.int32()))
    return sync.set_column(sync.schema.get_field_index("pid"), "pid", devices)


_NULL_INT = 1 << 62
"""Stands for NULL in the integer columns grouped below: sorts after any pid, context or device."""


def _int_columns(table: pa.Table, names: list[str]) -> list[np.ndarray]:
    """Columns as int64 numpy arrays, NULL as ``_NULL_INT``."""
    return [pc.fill_null(pc.cast(table.column(n), pa.int64()), _NULL_INT).to_numpy() for n in names]


def _first_of_each(rows: np.ndarray, key_width: int) -> list[tuple[tuple[int, ...], int]]:
    """For each distinct key (the first ``key_width`` columns of ``rows``), the smallest value of the
    last column: grouping in numpy, as pyarrow's group_by and join load its Acero engine (an import
    of 0.2-0.35 s in a fresh process)."""
    if len(rows) == 0:
        return []
    rows = np.unique(rows, axis=0)  # sorted: a key's rows are together, smallest value first
    keys = rows[:, :key_width]
    first = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)])
    return [(tuple(k), v) for k, v in zip(keys[first].tolist(), rows[first, -1].tolist(), strict=True)]


def _device_names(export: Export) -> dict[tuple[int | None, int], str]:
    """(pid or None, CUDA device index) -> GPU name, from TARGET_INFO_GPU (absent in trimmed exports)."""
    if "TARGET_INFO_GPU" not in export.tables or "name" not in export.columns("TARGET_INFO_GPU"):
        return {}
    gpus = {int(i): str(n) for i, n in export.con.execute("SELECT id, name FROM TARGET_INFO_GPU") if i is not None}
    names: dict[tuple[int | None, int], str] = {(None, i): n for i, n in gpus.items()}
    cols = export.columns("TARGET_INFO_CUDA_DEVICE")
    if all(c in cols for c in ("gpuId", "cudaId", "pid")):
        # CUDA_VISIBLE_DEVICES renumbers devices per process: map (pid, cudaId) through gpuId.
        for gpu_id, cuda_id, pid in export.con.execute("SELECT gpuId, cudaId, pid FROM TARGET_INFO_CUDA_DEVICE"):
            if gpu_id in gpus and cuda_id is not None:
                names[(pid, int(cuda_id))] = gpus[gpu_id]
    return names


def _process_names(export: Export) -> dict[int, str]:
    if "PROCESSES" not in export.tables or not {"pid", "name"} <= set(export.columns("PROCESSES")):
        return {}
    return {int(p): str(n) for p, n in export.con.execute("SELECT pid, name FROM PROCESSES") if p is not None}


def _order_units(rows: pa.Table) -> tuple[list[int], dict[int, list[int]]]:
    """The rank processes in ordinal order, and the devices each one used."""
    gpu = rows.filter(pc.is_in(rows.column("kind"), pa.array(GPU_ACTIVITY_KINDS)))
    gpu = gpu.filter(pc.is_valid(gpu.column("proc")))
    devices: dict[int, list[int]] = {}
    if gpu.num_rows:
        proc, device = _int_columns(gpu, ["proc", "device"])
        for proc_id, device_id in np.unique(np.stack([proc, device], axis=1), axis=0).tolist():
            devices.setdefault(proc_id, [])
            if device_id != _NULL_INT:
                devices[proc_id].append(device_id)
        procs = list(devices)
    else:
        valid = rows.filter(pc.is_valid(rows.column("proc")))
        procs = pc.unique(valid.column("proc")).to_pylist()
        devices = {p: [] for p in procs}
    big = 1 << 62
    procs.sort(key=lambda p: (min(devices[p]) if devices[p] else big, p))
    return procs, {p: sorted(d) for p, d in devices.items()}


class _ByProcess:
    """Row indices of each process, in (ts_ns, -dur_ns) order: one sort for the whole file, and one
    ``take`` (the only copy of the data) per rank — peak memory stays near twice the events."""

    def __init__(self, rows: pa.Table) -> None:
        keys = [("proc", "ascending", "at_end"), ("ts_ns", "ascending", "at_end"), ("dur_ns", "descending", "at_end")]
        self.order = pc.sort_indices(rows, sort_keys=keys)
        # null processes sort last; a sentinel above any pid keeps the key array sorted for searchsorted
        procs = pc.fill_null(pc.take(rows.column("proc"), self.order), 1 << 62)
        self.procs = procs.to_numpy()

    def indices(self, proc: int) -> pa.Array:
        lo, hi = np.searchsorted(self.procs, [proc, proc + 1])
        return self.order.slice(int(lo), int(hi - lo))

    def count(self, procs: list[int]) -> int:
        return sum(len(self.indices(p)) for p in procs)


def _events_for(rows: pa.Table, rank: int | None) -> pa.Table:
    """One process's rows, already in event order, as an ``events`` table: numbered, run_id null."""
    n = rows.num_rows
    cols: list[pa.Array | pa.ChunkedArray] = []
    for f in EVENTS_SCHEMA:
        if f.name == "event_id":
            cols.append(pa.array(np.arange(n, dtype=np.int64)))
        elif f.name == "rank":
            cols.append(pa.array(np.full(n, rank, dtype=np.int32)) if rank is not None else pa.nulls(n, pa.int32()))
        elif f.name in rows.column_names:
            cols.append(rows.column(f.name).cast(f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.table(cols, schema=EVENTS_SCHEMA)


def _parse(export: Export, path: Path) -> list[ParsedRank]:
    warnings: list[str] = []
    offset = _utc_offset(export)
    rows = _read_all(export, offset or 0, warnings)
    if rows.num_rows == 0:
        raise TraceFormatError(
            f"{path}: the Nsight export holds no kernels, memory copies, CUDA API calls or NVTX ranges; "
            "profile with `nsys profile --trace=cuda,nvtx` and export again"
        )
    unassigned = pc.sum(pc.is_null(rows.column("proc"))).as_py() or 0
    procs, devices = _order_units(rows)
    by_process = _ByProcess(rows)
    dropped = rows.num_rows - by_process.count(procs) - unassigned
    if dropped:
        others = len(pc.unique(rows.column("proc")).drop_null()) - len(procs)
        warnings.append(f"{path}: skipped {dropped} events of {others} process(es) without GPU activity")
    if unassigned:
        warnings.append(f"{path}: skipped {unassigned} events with no process id")

    evidence = nccl_ranks(export)
    if evidence and not set(procs) <= set(evidence):
        # mixing NCCL ranks with ordinals could give two processes one rank: all or nothing
        warnings.append(f"{path}: NCCL rank payloads cover only some processes; ranks follow the process order")
        evidence = {}
    device_names = _device_names(export)
    process_names = _process_names(export)
    host = export.capture_meta.get("DEVICE_DISPLAY_NAME") or None
    era = f"nsys-{export.schema_version}" if export.schema_version else "nsys"
    single = len(procs) == 1
    # The decoded SQLite size is split over the file's ranks so that per-rank sums give the file's size.
    sqlite_bytes = export.sqlite_path.stat().st_size
    shares = [sqlite_bytes // len(procs)] * len(procs)
    shares[0] += sqlite_bytes - sum(shares)
    result = []
    for ordinal, proc in enumerate(procs):
        mine = rows.take(by_process.indices(proc))
        found = evidence.get(proc)
        rank: int | None
        if found is not None:
            rank, source, world = found.rank, "nvtx_nccl", found.world_size
        else:
            rank, source, world = (None if single else ordinal), "nsys_order", None
        devs = devices.get(proc, [])
        device_name = None
        if devs:
            device_name = device_names.get((proc, devs[0])) or device_names.get((None, devs[0]))
        names = mine.column("name")
        nccl = pc.any(pc.fill_null(pc.starts_with(names, "nccl"), False)).as_py()
        metadata: dict[str, Any] = {
            "nsys_ordinal": ordinal,
            "nsys_ranks_in_file": len(procs),
            "nsys_devices": devs,
            "nsys_process_name": process_names.get(proc),
            "nsys_product_version": export.product_version,
            "nsys_schema_version": export.schema_version,
            "nsys_utc_offset_ns": offset,
            "warnings": list(warnings),
        }
        result.append(
            ParsedRank(
                rank=rank,
                rank_source=source,
                events=_events_for(mine, rank),
                file=path,
                file_bytes=path.stat().st_size,
                format="nsys",
                world_size=world,
                backend="nccl" if nccl else None,
                host=host,
                pid=proc,
                device_name=device_name,
                schema_era=era,
                metadata=metadata,
                source_bytes=shares[ordinal],
            )
        )
    return result

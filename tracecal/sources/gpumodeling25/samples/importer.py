"""Import the published GPUModeling25 microbenchmark CSVs as samples.

The rules are in docs/samples.md#importing-the-published-gpumodeling25-csvs.

A directory holds compute files ``<GPU>_<op>_<precision>.csv`` (shape columns plus ``F_dur(us)`` and
``B_dur(us)``, or one ``dur(us)``) and/or NCCL files ``<GPU>_<op>_<precision>[_<N>_<G>].csv``
(``shape, nodes, GPUsPerNode, dur(us)``; the suffix means N nodes × G GPUs per node; files without
it pool every topology of the op). ``<GPU>.csv`` is the tuned-config file with the published model
and hold-out error per op (``published_errors``).

Every CSV row becomes one sample per direction (fwd from ``F_dur``, bwd from ``B_dur``; a single
``dur`` is stored as fwd). ``op`` is the published name, ``family`` and the shape features come from
``ops``, ``source = 'imported:gpumodeling25'``, ``source_file`` the file name,
``params_json`` the CSV row, ``device_name`` the file name's GPU. The published value is the mean of
the 3rd–7th fastest of 10 profiled iterations (the published sampler's rule), stored as ``median_ns``;
``min_ns``, ``iqr_ns`` and ``repeats`` are unknown and stay NULL. Comm samples: ``size_bytes`` per
``nccl_size_bytes``, ``group_size = nodes·GPUsPerNode``, and ``pooled`` tells pooled files (true) from
per-topology ones (false): a calibration must use one or the other, or it counts rows twice.

Ids are ``published_sample_id``: the file name and 0-based row index (CSV order) identify a row, so
re-importing replaces and ``calibrate.validation`` recovers the published 80/20 split from the ids.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from tracecal.errors import InputNotFoundError, SampleError
from tracecal.samplers.quality import flag_counts, flag_samples
from tracecal.schema import SAMPLES, arrow_schema
from tracecal.sources.gpumodeling25.samples.ops import (
    COMPUTE_OPS,
    NCCL_COLUMNS,
    collective_of,
    nccl_size_bytes,
)
from tracecal.sql.samples import sample_id, write_samples

SOURCE = "imported:gpumodeling25"

FILE_PATTERN = re.compile(
    r"^(?P<device>[^_]+)_(?P<op>.+)_(?P<precision>fp16|bf16|fp32|fp8)(?:_(?P<nodes>\d+)_(?P<gpn>\d+))?\.csv$"
)
"""``<GPU>_<op>_<precision>[_<N>_<G>].csv``; the GPU name has no underscore (NVIDIAA100-SXM4-80GB)."""

DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp8": "float8_e4m3fn"}
DURATIONS = {"F_dur(us)": "fwd", "B_dur(us)": "bwd", "dur(us)": "fwd", "dur": "fwd"}
"""Duration columns (µs) and the direction each becomes. The legacy optimizer file says ``dur``."""


@dataclass(frozen=True)
class SampleFile:
    """One published sample CSV, recognised from its name."""

    path: Path
    device: str
    op: str
    precision: str
    nodes: int | None
    gpus_per_node: int | None

    @property
    def is_comm(self) -> bool:
        return collective_of(self.op) is not None


def discover(directory: Path) -> list[SampleFile]:
    """The sample CSVs directly in ``directory``, sorted by name (tuned-config files excluded).

    Raises:
        InputNotFoundError: the directory does not exist or holds no ``<GPU>_<op>_<precision>.csv``.
    """
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise InputNotFoundError(f"{directory} {what}; give the directory that holds the published sample CSVs")
    files = []
    for path in sorted(directory.glob("*.csv")):
        m = FILE_PATTERN.match(path.name)
        if m is None:
            continue
        files.append(
            SampleFile(
                path,
                m["device"],
                m["op"],
                m["precision"],
                int(m["nodes"]) if m["nodes"] else None,
                int(m["gpn"]) if m["gpn"] else None,
            )
        )
    if not files:
        nested = sorted({p.parent.name for p in directory.glob("*/*.csv") if FILE_PATTERN.match(p.name)})
        hint = f"; its subdirectories {', '.join(nested)} have some, import those" if nested else ""
        raise InputNotFoundError(
            f"no gpumodeling25 sample CSVs in {directory} (looked for <GPU>_<op>_fp16[_<N>_<G>].csv){hint}"
        )
    return files


def published_sample_id(cluster: str, op: str, direction: str, file_name: str, row: int) -> str:
    """``sample_id`` of an imported row: row ``row`` (0-based, CSV order, header excluded) of file
    ``file_name`` (no directory), for one direction. A stable contract: calibration relies on it."""
    return sample_id(cluster, SOURCE, op, direction, {"file": file_name, "row": row})


def _read_numeric(path: Path) -> pl.DataFrame:
    """The CSV with every column as Float64; a one-line SampleError if it is not such a CSV."""
    try:
        raw = pl.read_csv(path, infer_schema_length=0)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise SampleError(f"{path} is not a readable CSV: {str(exc).splitlines()[0]}") from exc
    try:
        return raw.select(pl.all().str.strip_chars().cast(pl.Float64, strict=True))
    except pl.exceptions.PolarsError as exc:
        raise SampleError(f"{path}: a value is not a number ({str(exc).splitlines()[0]})") from exc


def _whole(value: float, path: Path, line: int, column: str) -> int:
    if value != value or not float(value).is_integer():  # NaN or fractional
        raise SampleError(f"{path}:{line}: {column} = {value} is not a whole number")
    return int(value)


def _check_columns(path: Path, frame: pl.DataFrame, expected: tuple[str, ...], durations: list[str]) -> None:
    missing = [c for c in expected if c not in frame.columns]
    unknown = [c for c in frame.columns if c not in expected and c not in DURATIONS]
    if missing or unknown or not durations:
        raise SampleError(
            f"{path}: unexpected columns {', '.join(frame.columns)}; a {path.stem.split('_', 1)[-1]} file needs "
            f"{', '.join(expected)} and F_dur(us)/B_dur(us) or dur(us)"
        )


def _base_row(f: SampleFile, cluster: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(SAMPLES.column_names)
    row.update(
        cluster=cluster,
        device_name=f.device,
        op=f.op,
        source=SOURCE,
        source_file=f.path.name,
    )
    return row


def _params_json(values: dict[str, float]) -> str:
    return msgspec.json.encode({k: (int(v) if v.is_integer() else v) for k, v in values.items()}).decode()


def _duration_ns(value: float | None) -> float | None:
    # a NaN/empty cell is a missing measurement (NULL); non-positive values are kept for the flags
    return None if value is None or value != value else value * 1000.0


def compute_rows(f: SampleFile, cluster: str) -> list[dict[str, Any]]:
    """Sample rows (dicts of ``samples`` columns, ``sampled_at`` left to the caller) of one compute file.

    Raises:
        SampleError: unknown op, unexpected columns, or a row whose shape is not whole/divisible.
    """
    spec = COMPUTE_OPS.get(f.op)
    if spec is None:
        raise SampleError(
            f"{f.path}: {f.op!r} is not a known gpumodeling25 op (known: {', '.join(sorted(COMPUTE_OPS))}, "
            "and NCCL allreduce/allgather/p2p); rename or remove the file"
        )
    frame = _read_numeric(f.path)
    durations = [c for c in frame.columns if c in DURATIONS]
    _check_columns(f.path, frame, spec.columns, durations)
    rows = []
    for index, values in enumerate(frame.iter_rows(named=True)):
        line = index + 2  # 1-based, after the header
        shape = {c: _whole(values[c], f.path, line, c) for c in spec.columns}
        try:
            features = spec.features(shape)
        except ValueError as exc:
            raise SampleError(f"{f.path}:{line}: {exc}") from exc
        for column in durations:
            direction = DURATIONS[column]
            row = _base_row(f, cluster)
            row.update(features)
            row.update(
                sample_id=published_sample_id(cluster, f.op, direction, f.path.name, index),
                family=spec.family,
                direction=direction,
                tp=shape["mp"] if spec.tp_column else None,
                dtype=DTYPES[f.precision],
                median_ns=_duration_ns(values[column]),
                params_json=_params_json(values),
            )
            rows.append(row)
    return rows


def comm_rows(f: SampleFile, cluster: str) -> list[dict[str, Any]]:
    """Sample rows of one NCCL file (per-topology or pooled).

    Raises:
        SampleError: unexpected columns, a non-whole value, or a row whose nodes/GPUsPerNode
            contradict the file name's ``_N_G`` suffix.
    """
    collective = collective_of(f.op)
    assert collective is not None
    frame = _read_numeric(f.path)
    durations = [c for c in frame.columns if c in DURATIONS]
    _check_columns(f.path, frame, NCCL_COLUMNS, durations)
    if durations != ["dur(us)"]:
        raise SampleError(f"{f.path}: an NCCL file needs one dur(us) column, found {', '.join(durations)}")
    pooled = f.nodes is None
    rows = []
    for index, values in enumerate(frame.iter_rows(named=True)):
        line = index + 2
        elements = _whole(values["shape"], f.path, line, "shape")
        nodes = _whole(values["nodes"], f.path, line, "nodes")
        gpn = _whole(values["GPUsPerNode"], f.path, line, "GPUsPerNode")
        if not pooled and (nodes, gpn) != (f.nodes, f.gpus_per_node):
            raise SampleError(
                f"{f.path}:{line}: nodes={nodes}, GPUsPerNode={gpn} contradict the file name's "
                f"_{f.nodes}_{f.gpus_per_node}"
            )
        group = nodes * gpn
        size = nccl_size_bytes(collective, elements, group)
        row = _base_row(f, cluster)
        row.update(
            sample_id=published_sample_id(cluster, f.op, "fwd", f.path.name, index),
            family="comm",
            direction="fwd",
            dtype=DTYPES[f.precision],
            io_bytes=float(size),
            collective=collective,
            size_bytes=size,
            group_size=group,
            nodes=nodes,
            gpus_per_node=gpn,
            pooled=pooled,
            median_ns=_duration_ns(values["dur(us)"]),
            params_json=_params_json(values),
        )
        rows.append(row)
    return rows


Progress = Callable[[int, int, str], None]
"""``progress(done, total, label)``: called after each file (the CLI draws a bar with it)."""


def load_gpumodeling25(
    directory: Path, cluster: str, imported_at: datetime | None = None, progress: Progress | None = None
) -> pa.Table:
    """Every sample CSV in ``directory`` as one Arrow table conforming to ``arrow_schema(SAMPLES)``.

    Nothing is returned (and so nothing can be written) unless every file parses.

    Raises:
        InputNotFoundError: see ``discover``.
        SampleError: a file has an unknown op, unexpected columns or a malformed value (the message
            names the file and line).
    """
    when = imported_at or datetime.now(timezone.utc).replace(tzinfo=None)
    rows: list[dict[str, Any]] = []
    files = discover(directory)
    for done, f in enumerate(files, start=1):
        rows.extend(comm_rows(f, cluster) if f.is_comm else compute_rows(f, cluster))
        if progress is not None:
            progress(done, len(files), f.path.name)
    table = pa.Table.from_pylist(rows, schema=arrow_schema(SAMPLES))
    # one import time for every row
    micros = round(when.replace(tzinfo=timezone.utc).timestamp() * 1_000_000)
    stamps = pa.array(np.full(table.num_rows, micros, dtype=np.int64)).cast(pa.timestamp("us"))
    return table.set_column(table.schema.get_field_index("sampled_at"), "sampled_at", stamps)


@dataclass(frozen=True)
class ImportResult:
    """What ``import_gpumodeling25`` stored."""

    files: int
    samples: int
    flags: dict[str, int]
    """Flagged samples per quality reason."""


def import_gpumodeling25(
    con: duckdb.DuckDBPyConnection, directory: Path, cluster: str, progress: Progress | None = None
) -> ImportResult:
    """Load every sample CSV of ``directory``, flag implausible rows (``quality.flag_samples``) and
    upsert them for ``cluster`` in one transaction: all files or nothing. Re-importing replaces.

    Raises:
        InputNotFoundError, SampleError: see ``load_gpumodeling25``; nothing is written.
    """
    files = discover(directory)
    table = load_gpumodeling25(directory, cluster, progress=progress)
    frame = flag_samples(pl.from_arrow(table))  # type: ignore[arg-type]
    written = write_samples(con, frame.to_arrow(), origin=str(directory))
    return ImportResult(files=len(files), samples=written, flags=flag_counts(frame))


def topology_label(nodes: int | None, gpus_per_node: int | None) -> str | None:
    """``"2x4"`` for 2 nodes × 4 GPUs per node; ``"pooled"`` for the published 0/0 (all topologies)."""
    if nodes is None or gpus_per_node is None:
        return None
    if nodes == 0 and gpus_per_node == 0:
        return "pooled"
    return f"{nodes}x{gpus_per_node}"


def _config_json(text: str, path: Path) -> str:
    try:
        return msgspec.json.encode(ast.literal_eval(text)).decode()
    except (ValueError, SyntaxError) as exc:
        raise SampleError(f"{path}: Best_config {text[:40]!r} is not a Python dict literal") from exc


def published_errors(directory: Path) -> pl.DataFrame:
    """The published tuned models and hold-out errors of the tuned-config file(s) ``<GPU>.csv``.

    Returns one row per op, direction and topology: ``op`` (published name), ``direction`` (fwd/bwd;
    the optimizers' ``dur`` is fwd, like their samples), ``topology`` (``"NxG"``, ``"pooled"`` for the
    pooled NCCL model, NULL for compute), ``published_model`` (rforest/xgboost),
    ``published_config`` (its hyper-parameters as JSON text) and ``published_mape_pct``
    (``Best_error%`` × 100: the file stores a fraction, 0.068 = 6.8 %; 80/20 split, random_state 42).

    Raises:
        InputNotFoundError: no tuned-config ``<GPU>.csv`` in ``directory``.
        SampleError: the file lacks the expected columns.
    """
    if not directory.is_dir():
        raise InputNotFoundError(f"{directory} is not a directory of published samples")
    files = [p for p in sorted(directory.glob("*.csv")) if "_" not in p.name]
    if not files:
        raise InputNotFoundError(f"no tuned-config file <GPU>.csv (e.g. NVIDIAA100-SXM4-80GB.csv) in {directory}")
    frames = []
    for path in files:
        try:
            raw = pl.read_csv(path, infer_schema_length=0)
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise SampleError(f"{path} is not a readable CSV: {str(exc).splitlines()[0]}") from exc
        needed = {"Function", "Best_model", "Best_config", "Best_error%"}
        if not needed <= set(raw.columns) or not ({"Propagation"} <= set(raw.columns) or {"Nodes"} <= set(raw.columns)):
            raise SampleError(
                f"{path}: unexpected columns {', '.join(raw.columns)}; a tuned-config file has Function, "
                "Propagation (or Nodes, GPUsPerNode), Best_model, Best_config, Best_error%"
            )
        rows = []
        for r in raw.iter_rows(named=True):
            if "Propagation" in raw.columns:
                direction = "fwd" if r["Propagation"] == "dur" else r["Propagation"]
                topology = None
            else:
                direction = "fwd"
                topology = topology_label(int(float(r["Nodes"])), int(float(r["GPUsPerNode"])))
            rows.append(
                {
                    "op": r["Function"],
                    "direction": direction,
                    "topology": topology,
                    "published_model": r["Best_model"],
                    "published_config": _config_json(r["Best_config"], path),
                    "published_mape_pct": float(r["Best_error%"]) * 100.0,
                }
            )
        frames.append(pl.DataFrame(rows, schema=_PUBLISHED_SCHEMA))
    return pl.concat(frames).sort("op", "direction", "topology", nulls_last=True)


_PUBLISHED_SCHEMA = {
    "op": pl.Utf8,
    "direction": pl.Utf8,
    "topology": pl.Utf8,
    "published_model": pl.Utf8,
    "published_config": pl.Utf8,
    "published_mape_pct": pl.Float64,
}

"""Opening Nsight Systems exports: ``.sqlite``, ``.sqlite.gz`` and ``.nsys-rep`` files.

``open_export(path)`` is a context manager that yields an ``Export``: a read-only ``sqlite3``
connection on the export plus what its ``META_DATA_EXPORT`` / ``META_DATA_CAPTURE`` tables say.

- ``.sqlite.gz`` is decompressed into a temporary directory that is removed on exit (SQLite
  cannot read a compressed stream).
- ``.nsys-rep`` is converted with ``nsys export --type sqlite`` into a cache directory next to the
  report (``<dir>/.tracecal-nsys/<name>.sqlite``), reused while it is newer than the report. Without
  ``nsys`` on PATH a ``TraceFormatError`` gives the exact command to run.
- Anything that is not an Nsight Systems SQLite export, or an export whose schema major version is not
  3, raises ``TraceFormatError`` with one line naming the file. Tested on schema 3.24 and 3.25.

Only the standard library ``sqlite3`` is used: DuckDB's sqlite scanner would need an extension
download at run time.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tracecal.errors import InputNotFoundError, TraceFormatError

SQLITE_MAGIC = b"SQLite format 3\x00"
SUPPORTED_SCHEMA_MAJOR = 3
CACHE_DIR_NAME = ".tracecal-nsys"


@dataclass
class Export:
    """An open Nsight export.

    Attributes:
        con: read-only connection; owned by ``open_export``, closed on exit.
        path: the file the user gave (``.sqlite``, ``.sqlite.gz`` or ``.nsys-rep``).
        sqlite_path: the SQLite file actually opened (a temporary or cached file for gz / nsys-rep).
        tables: names of the tables present (exports create tables lazily).
        schema_version: ``EXPORT_SCHEMA_VERSION`` (e.g. ``3.25.0``) or None in exports without it.
        product_version: ``EXPORT_PRODUCT_VERSION`` (the Nsight Systems version) or None.
        export_meta: all ``META_DATA_EXPORT`` name/value pairs.
        capture_meta: ``META_DATA_CAPTURE`` name/value pairs (the last value when a name repeats).
    """

    con: sqlite3.Connection
    path: Path
    sqlite_path: Path
    tables: frozenset[str]
    schema_version: str | None = None
    product_version: str | None = None
    export_meta: dict[str, str] = field(default_factory=dict)
    capture_meta: dict[str, str] = field(default_factory=dict)

    def columns(self, table: str) -> list[str]:
        """Column names of ``table`` (empty when the table is absent)."""
        if table not in self.tables:
            return []
        # Table names come from sqlite_master (checked membership above), never from the user.
        return [row[1] for row in self.con.execute(f'PRAGMA table_info("{table}")')]


def export_command(rep: Path, output: Path, *, blobs: bool = True) -> list[str]:
    """The ``nsys export`` command converting ``rep`` to SQLite at ``output``.

    ``--include-blobs=true`` keeps NVTX payloads (NCCL's ranks and message sizes); releases whose
    ``nsys export`` lacks the option are retried without it (``blobs=False``).
    """
    cmd = ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true"]
    if blobs:
        cmd.append("--include-blobs=true")
    return [*cmd, "--output", str(output), str(rep)]


def _cached_sqlite(rep: Path) -> Path:
    """Convert ``rep`` with ``nsys export`` into the cache next to it (reused while fresh)."""
    cache = rep.parent / CACHE_DIR_NAME / (rep.name[: -len(".nsys-rep")] + ".sqlite")
    if cache.exists() and cache.stat().st_mtime >= rep.stat().st_mtime:
        return cache
    nsys = shutil.which("nsys")
    suggested = rep.with_name(rep.name[: -len(".nsys-rep")] + ".sqlite")
    if nsys is None:
        shown = " ".join(export_command(rep, suggested))
        raise TraceFormatError(
            f"{rep}: Nsight report needs converting and `nsys` is not on PATH; run `{shown}` "
            "and ingest again (the .sqlite beside the report is then read instead of it)"
        )
    try:
        cache.parent.mkdir(exist_ok=True)
    except OSError as exc:
        raise TraceFormatError(
            f"{rep}: cannot create the export cache {cache.parent} ({exc.strerror}); "
            f"run `{' '.join(export_command(rep, suggested))}` where you can write"
        ) from exc
    tmp = cache.with_suffix(".sqlite.partial")
    for blobs in (True, False):
        cmd = [nsys, *export_command(rep, tmp, blobs=blobs)[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode == 0 and tmp.exists():
            break
    if done.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        last = (done.stderr or done.stdout).strip().splitlines()
        reason = last[-1] if last else f"exit status {done.returncode}"
        raise TraceFormatError(f"{rep}: `nsys export --type sqlite` failed: {reason}")
    os.replace(tmp, cache)  # atomic: a concurrent reader never sees a half-written export
    return cache


def _decompress(path: Path, directory: Path) -> Path:
    out = directory / path.name[: -len(".gz")]
    try:
        with gzip.open(path, "rb") as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"{path}: corrupt gzip ({exc}); re-copy or re-export the file") from exc
    return out


def _read_meta(con: sqlite3.Connection, table: str) -> dict[str, str]:
    meta: dict[str, str] = {}
    for name, value in con.execute(f'SELECT name, value FROM "{table}"'):
        if name is not None and value is not None:
            meta[str(name)] = str(value)
    return meta


def _check_sqlite_header(path: Path, shown: Path) -> None:
    with path.open("rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        raise TraceFormatError(
            f"{shown}: not an SQLite file; Nsight reports must be exported with `nsys export --type sqlite`"
        )


def _connect(path: Path, shown: Path) -> Export:
    _check_sqlite_header(path, shown)
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        tables = frozenset(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    except sqlite3.DatabaseError as exc:
        raise TraceFormatError(f"{shown}: unreadable SQLite file ({exc}); re-export it with nsys export") from exc
    export = Export(con=con, path=shown, sqlite_path=path, tables=tables)
    try:
        _validate(export)
    except BaseException:
        con.close()
        raise
    return export


def _validate(export: Export) -> None:
    """Nsight exports always hold ``StringIds`` and (since schema 3.x) ``META_DATA_EXPORT``."""
    has_events = any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in export.tables) or "NVTX_EVENTS" in export.tables
    if "StringIds" not in export.tables or not ("META_DATA_EXPORT" in export.tables or has_events):
        raise TraceFormatError(
            f"{export.path}: SQLite file is not an Nsight Systems export (no StringIds / META_DATA_EXPORT "
            "tables); give the output of `nsys export --type sqlite`"
        )
    if "META_DATA_EXPORT" in export.tables:
        export.export_meta = _read_meta(export.con, "META_DATA_EXPORT")
    if "META_DATA_CAPTURE" in export.tables:
        export.capture_meta = _read_meta(export.con, "META_DATA_CAPTURE")
    export.schema_version = export.export_meta.get("EXPORT_SCHEMA_VERSION")
    export.product_version = export.export_meta.get("EXPORT_PRODUCT_VERSION")
    if export.schema_version is not None:
        major = export.schema_version.split(".", 1)[0]
        if major != str(SUPPORTED_SCHEMA_MAJOR):
            raise TraceFormatError(
                f"{export.path}: Nsight export schema {export.schema_version} is not supported "
                f"(tracecal reads schema {SUPPORTED_SCHEMA_MAJOR}.x, tested on 3.24 and 3.25); re-export with "
                "an Nsight Systems release from 2024 or later"
            )


@contextmanager
def open_export(path: Path) -> Iterator[Export]:
    """Open an Nsight export for reading; see the module docstring for the accepted files.

    Raises:
        InputNotFoundError: ``path`` does not exist.
        TraceFormatError: not SQLite, not an Nsight export, unsupported schema, corrupt gzip, or an
        ``.nsys-rep`` that cannot be converted.
    """
    path = Path(path)
    name = path.name.lower()
    if not path.is_file():
        raise InputNotFoundError(f"Nsight export {path} does not exist")
    with tempfile.TemporaryDirectory(prefix="tracecal-nsys-") as tmp:
        if name.endswith(".gz"):
            sqlite_path = _decompress(path, Path(tmp))
        elif name.endswith(".nsys-rep"):
            sqlite_path = _cached_sqlite(path)
        else:
            sqlite_path = path
        export = _connect(sqlite_path, path)
        try:
            yield export
        finally:
            export.con.close()

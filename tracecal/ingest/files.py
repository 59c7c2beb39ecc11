"""Reading trace files from disk: plain or gzip-compressed, with failures named by file."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from tracecal.errors import InputNotFoundError, TraceFormatError


def read_trace_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when the name ends in ``.gz``.

    Peak memory is the compressed plus the uncompressed size (the whole document is needed by the
    JSON decoder anyway).

    Raises:
        InputNotFoundError: the file does not exist or cannot be read.
        TraceFormatError: a ``.gz`` file is not valid gzip or is truncated.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise InputNotFoundError(f"trace file {path} does not exist") from exc
    except OSError as exc:
        raise InputNotFoundError(f"cannot read trace file {path}: {exc.strerror}") from exc
    if path.name.endswith(".gz"):
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(
                f"{path}: corrupt or truncated gzip ({exc}); re-copy the file or remove it from the run"
            ) from exc
    return data

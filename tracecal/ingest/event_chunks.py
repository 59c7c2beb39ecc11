"""A Kineto document read as a stream: its event array cut into chunks at event boundaries.

msgspec decodes only whole documents, so a multi-GB rank is not decoded at once: the stream is read in
blocks, and the ``traceEvents`` array is cut after an event (``}`` then ``,`` then ``{``, white space
allowed) into chunks of about ``CHUNK_BYTES``, each decoded on its own as ``[chunk]``. A cut is a true
event boundary exactly when ``[chunk]`` is valid JSON: the chunk starts at a boundary, and a cut inside a
string or a nested value leaves the string or the value open. A cut that fails is replaced by an earlier
candidate; the JSON itself is checked by msgspec, never by this module. The metadata before the array
(the document's ``prefix``) and after it (its ``tail``) are kept as bytes and decoded together once the
array has ended.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from tracecal.errors import TraceFormatError

CHUNK_BYTES = 24 * 2**20
"""Bytes of the event array decoded at a time (about 80 000 events of a GPU trace); below glibc's
32 MB mmap threshold, so each window reuses heap pages instead of faulting in fresh ones."""

_HEADER_MAX_BYTES = 256 * 2**20
"""How far into a document ``traceEvents`` is looked for before it is called not a Kineto trace."""

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_SEARCH_BYTES = 1 << 16
"""A cut is first looked for in the last this many bytes of a window (events are far smaller)."""
_ERROR_BYTE = re.compile(r"\(byte (\d+)\)$")
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])
_OPEN, _CLOSE, _COMMA = ord("["), ord("]"), ord(",")

Decoded = TypeVar("Decoded")


@dataclass
class Document:
    """What is known of a streamed document: the bytes before its event array (``prefix``: an object's
    opening and the keys before ``traceEvents``; empty for a 2021 top-level array) and, once the
    chunks are read, the bytes after it (``tail``)."""

    prefix: bytes
    top_level_array: bool
    tail: bytes | None = None

    def header(self) -> bytes:
        """The document with an empty event array (once the chunks are read)."""
        if self.top_level_array:
            return b"{}"
        return self.prefix + b'"traceEvents":[]' + (self.tail or b"}")


class _Window:
    """The stream's bytes from some point on: ``buf[:end]``, in a ``bytearray`` (a chunk is decoded in
    place) that may be longer than ``end``.

    Two buffers take turns: the bytes kept at each step go to the other one, so that the values decoded
    from the last chunk (``msgspec.Raw`` slices) may still point into the current one; the other is
    reused when nothing points into it any more (no buffer export), else a new one is made. A reused
    buffer's pages are already the process's: filling a fresh window of ``CHUNK_BYTES`` page by page cost
    the kernel a page fault every 4 KB."""

    def __init__(self, first: bytes, rest: Iterator[bytes]) -> None:
        self.buf, self.rest, self.eof = bytearray(first), rest, False
        self.end = len(self.buf)
        self.spare: bytearray | None = None

    def ensure(self, start: int, size: int) -> int:
        """Read until ``size`` bytes follow ``start`` (or the end); returns the new index of ``start``
        (the bytes before it are dropped)."""
        if self.end - start >= size or self.eof:
            return start
        kept = self.end - start
        buf = _unused(self.spare)
        if buf is None:
            buf = bytearray(max(size, kept) + _BLOCK_SLACK)
        _fit(buf, kept)
        buf[:kept] = memoryview(self.buf)[start : self.end]  # same length: no resize
        end = kept
        while end < size:
            block = next(self.rest, None)
            if block is None:
                self.eof = True
                break
            _fit(buf, end + len(block))
            buf[end : end + len(block)] = block
            end += len(block)
        self.spare = self.buf if len(self.buf) <= _REUSED_MAX_BYTES else None
        self.buf, self.end = buf, end
        return 0


_BLOCK_SLACK = 8 * 2**20
"""Bytes a new window buffer holds beyond the bytes asked for: the last block read overshoots."""

_REUSED_MAX_BYTES = 4 * CHUNK_BYTES
"""A buffer longer than this (the first, which holds what was read before streaming began) is not kept
for reuse."""


def _unused(buf: bytearray | None) -> bytearray | None:
    """``buf`` when nothing points into it (no export: it can be resized), else None."""
    if buf is None:
        return None
    try:
        buf.append(0)
    except BufferError:
        return None
    del buf[-1]
    return buf


def _fit(buf: bytearray, size: int) -> None:
    """Make ``buf`` at least ``size`` bytes long (zeros added; never shorter)."""
    if len(buf) < size:
        buf.extend(bytes(size - len(buf) + _BLOCK_SLACK))


def open_document(
    path: Path, first: bytes, rest: Iterator[bytes], decode: Callable[[memoryview, int], tuple[list[Any], Decoded]]
) -> tuple[Document, Iterator[tuple[int, list[Any], Decoded]]]:
    """The document of a stream (``first`` then the blocks of ``rest``) and its decoded event chunks.

    ``decode(array, offset)`` decodes one JSON array of whole events whose first is the file's event
    ``offset``, and returns the events and anything else; it raises ``TraceFormatError`` on invalid
    JSON. The chunks come as ``(offset, events, anything else)``; the document's ``tail`` is set
    when they are exhausted.

    Raises:
        TraceFormatError: not JSON, no ``traceEvents`` array, invalid JSON, or an array that never ends.
    """
    window = _Window(first, rest)
    window.ensure(0, 64)
    head = bytes(window.buf[: min(64, window.end)]).lstrip()[:1]
    if head == b"[":
        begin = window.buf.index(b"[", 0, window.end) + 1
        document = Document(b"", top_level_array=True)
    elif head == b"{":
        match = _EVENTS_KEY.search(window.buf, 0, window.end)
        while match is None:
            if window.eof or window.end > _HEADER_MAX_BYTES:
                raise TraceFormatError(
                    f"{path}: JSON but not a Kineto trace (no traceEvents array); "
                    "move it out of the run or pass --on-error skip"
                )
            window.ensure(0, window.end + CHUNK_BYTES)
            match = _EVENTS_KEY.search(window.buf, 0, window.end)
        document = Document(bytes(window.buf[: match.start()]), top_level_array=False)
        begin = match.end()
    else:
        raise TraceFormatError(
            f"{path}: not JSON (starts with {bytes(window.buf[: min(16, window.end)])!r}); "
            "expected a torch.profiler trace"
        )
    return document, _chunks(path, window, begin, document, decode)


def _chunks(
    path: Path,
    window: _Window,
    pos: int,
    document: Document,
    decode: Callable[[memoryview, int], tuple[list[Any], Any]],
) -> Iterator[tuple[int, list[Any], Any]]:
    """``pos``: the first byte after ``[`` or after the comma that ends the previous chunk."""
    offset = 0
    while True:
        pos = window.ensure(pos - 1, CHUNK_BYTES) + 1
        end = window.end
        cut = None
        if not window.eof or end - pos > CHUNK_BYTES:
            # a larger window when an event is larger than a chunk
            cut = _cut(path, window.buf, pos, min(pos + CHUNK_BYTES, end), offset, decode) or _cut(
                path, window.buf, pos, end, offset, decode
            )
        if cut is None and window.eof:
            close, document.tail = _array_end(path, window.buf, pos, end, document)
            window.buf[pos - 1] = _OPEN
            events, other = decode(memoryview(window.buf)[pos - 1 : close + 1], offset)
            if events:
                yield offset, events, other
            return
        if cut is None:
            pos = window.ensure(pos - 1, end - pos + 1 + CHUNK_BYTES) + 1
            continue
        comma, (events, other) = cut
        del cut
        yield offset, events, other
        offset += len(events)
        del events, other  # the consumer's alone while the next chunk is read and decoded
        pos = comma + 1


def _cut(
    path: Path, buf: bytearray, pos: int, stop: int, offset: int, decode: Callable[[memoryview, int], Any]
) -> tuple[int, Any] | None:
    """The events from ``pos`` to the last event boundary before ``stop`` whose cut is valid JSON,
    decoded in place as ``[events]`` (the bytes before ``pos`` and at the cut become the brackets);
    None when there is no such boundary.

    Raises:
        TraceFormatError: the events up to a valid cut are damaged (``decode``'s error), or the JSON
            before the candidate cuts is invalid.
    """
    low = max(pos, stop - _SEARCH_BYTES)
    while True:
        for match in reversed(list(_BOUNDARY.finditer(buf, low, stop))):
            comma = buf.index(b",", match.start())
            buf[pos - 1], buf[comma] = _OPEN, _CLOSE
            view = memoryview(buf)[pos - 1 : comma + 1]
            try:
                return comma, decode(view, offset)
            except (TraceFormatError, msgspec.DecodeError):
                if _cut_is_valid(path, view):  # the events themselves are damaged
                    raise
            finally:
                del view
            buf[comma] = _COMMA  # a cut inside a string or a nested value: an earlier one
        if low == pos:
            return None
        stop, low = low + 16, max(pos, low - 16 * _SEARCH_BYTES)


def _cut_is_valid(path: Path, view: memoryview) -> bool:
    """Whether ``view`` is a valid JSON array; False when it is cut off (the cut was inside a value).

    Raises:
        TraceFormatError: invalid JSON before the end (damage no cut explains)."""
    try:
        _raw_list.decode(view)
    except msgspec.DecodeError as exc:
        position = _ERROR_BYTE.search(str(exc))
        if position is not None and int(position.group(1)) < len(view) - 1:
            raise TraceFormatError(
                f"{path}: invalid JSON in traceEvents ({exc}); the file is truncated or corrupt"
            ) from exc
        return False
    return True


def _array_end(path: Path, buf: bytearray, pos: int, stop: int, document: Document) -> tuple[int, bytes]:
    """The index of the ``]`` that ends the array (the last bytes are ``buf[:stop]``), and the
    document's tail after it: the last ``]`` that leaves a valid document after it and valid events
    before it."""
    end = stop
    while True:
        close = buf.rfind(b"]", pos, end)
        if close < 0:
            break
        tail = bytes(buf[close + 1 : stop])
        if document.top_level_array:
            rest_valid = not tail.strip(b" \t\r\n")
        else:
            rest_valid = _valid(Document(document.prefix, False, tail).header())
        if rest_valid:
            saved, buf[pos - 1] = buf[pos - 1], _OPEN
            valid = _valid(memoryview(buf)[pos - 1 : close + 1])
            buf[pos - 1] = saved
            if valid:
                return close, tail
        end = close
    raise TraceFormatError(f"{path}: invalid JSON in traceEvents (no end of the array); the file is truncated")


def _valid(data: bytes | memoryview) -> bool:
    try:
        if data[:1] == b"[":
            _raw_list.decode(data)
        else:
            msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return True

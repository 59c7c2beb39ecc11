"""Keep freed host memory in the process (glibc ``mallopt``), as a GPU caching allocator keeps device blocks.

Why: with glibc's defaults a CPU training process hands large freed blocks back to the kernel
(``munmap`` of blocks above the mmap threshold, heap trimming above the trim threshold), so the next
tensor of that size starts on fresh pages and its operator pays one page fault per 4 KiB it writes.
Measured on this project's VM: ``aten::gelu_backward`` on 256×1024 fp32 takes 0.41 ms on recycled
memory and 0.98 ms on fresh pages (257 faults per call); traces of the reference workload show both
modes for the same call. A microbenchmark loop recycles its blocks, so it only ever sees the first
mode. GPU training does not have this effect (PyTorch's CUDA caching allocator reuses device blocks),
and PyTorch's CPU tuning guide recommends allocators that keep memory (jemalloc, tcmalloc) for the
same reason; here glibc is told to do it: blocks up to ``MMAP_THRESHOLD_BYTES`` come from the heap,
and the heap is never trimmed.

``retain_freed_memory()`` applies it to the calling process and says what it did (for ``run.json``
and ``params_json``): ``{"allocator": "glibc", "mmap_threshold_bytes": ..., "trim_threshold_bytes":
...}``, or None where the C library is not glibc (nothing changed). Call it before the work starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
from typing import Any

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameters (glibc ``malloc.h``)."""

MMAP_THRESHOLD_BYTES = 32 << 20
"""glibc's largest mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``); larger blocks are
always mapped afresh."""

TRIM_THRESHOLD_BYTES = 2**31 - 1
"""The largest value ``mallopt`` takes (a C int): the heap's free top goes back to the kernel only
beyond 2 GiB."""


@functools.cache
def _mallopt() -> Any:
    """glibc's ``mallopt``, or None (looked up once: ``find_library`` may run ``ldconfig``)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    mallopt = ctypes.CDLL(path).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def retain_freed_memory() -> dict[str, Any] | None:
    """Make glibc keep freed blocks in this process; return the settings, or None if not glibc.
    Idempotent."""
    mallopt = _mallopt()
    if mallopt is None:
        return None
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = ok and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not ok:
        return None
    return {
        "allocator": "glibc",
        "mmap_threshold_bytes": MMAP_THRESHOLD_BYTES,
        "trim_threshold_bytes": TRIM_THRESHOLD_BYTES,
    }

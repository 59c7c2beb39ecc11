"""Parsing trace files in parallel: the calling process and ``workers - 1`` helper processes, each with
at most one file in flight.

``ParserPool`` is created once per ingest and shared by its runs. Results come back in completion
order, so the caller can store each rank as soon as it is parsed and drop it: neither a helper nor
the caller ever holds a whole run.

Helpers are started one of two ways:

- ``ParserPool(n).start()`` *before any DuckDB connection is opened in this process* (what
  ``trace-ingest`` does) forks them at once from the caller (``fork``: the helpers inherit every
  imported module and start in milliseconds, so even a run of a few 1 MB ranks is worth splitting).
  Forking is only safe while the process has no DuckDB threads: a thread that holds a lock at the
  moment of the fork leaves it locked forever in the child. The library threads that do exist then
  (the numpy/OpenBLAS, Arrow and polars pools) are idle, and the helpers only run the parsers
  (msgspec, pyarrow, numpy), never DuckDB or polars; Arrow and glibc malloc re-initialise their
  locks in a forked child. The pool forks all helpers on that one call and never again.
- otherwise (a library caller that already holds a connection) helpers come from a ``forkserver``
  on first need, which costs about a second of CPU to import the parser there: only runs of at
  least ``PARALLEL_MIN_BYTES`` use them.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tracecal.errors import TracecalError, WorkerError
from tracecal.ingest.discover import TraceFile
from tracecal.ingest.parse import parse_trace_file
from tracecal.ingest.trace import ParsedRank

OnError = Literal["raise", "skip"]

PARALLEL_MIN_BYTES = 64 * 2**20
"""Below this much uncompressed trace in a run, a pool without forked helpers parses in the calling
process: starting fork-server helpers (about a second of CPU) would cost more than parsing (~50 MB of
JSON per CPU second). Forked helpers (``ParserPool.start``) are used for any run of several files."""

_PRELOAD = ["tracecal.ingest.kineto", "pandas"]
"""Imported once in the fork server, so helpers forked from it start warm. pandas: pyarrow imports
it on its first ``pa.array()`` of Python objects (0.3 s of CPU) when it is installed."""


@dataclass(frozen=True)
class Skipped:
    """A file or run left out under ``on_error="skip"``, and why."""

    path: Path
    reason: str


class ParserPool:
    """``workers`` parsers: this process and ``workers - 1`` helper processes. ``workers <= 1`` or a
    single file parse here only; so do runs under ``PARALLEL_MIN_BYTES`` unless ``start`` forked the
    helpers."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._executor: ProcessPoolExecutor | None = None
        self._forked = False

    def __enter__(self) -> ParserPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def start(self) -> ParserPool:
        """Fork the helper processes now; call it before opening any DuckDB connection in this
        process (see the module docstring). No-op for one worker, or off Linux (macOS system libraries
        are not fork-safe; there the fork server is used)."""
        if self.workers > 1 and self._executor is None and sys.platform.startswith("linux"):
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers - 1, mp_context=multiprocessing.get_context("fork")
            )
            # The fork context launches every helper on the first submit, from this thread, before
            # the executor starts its own threads. gc.freeze: a helper's garbage collections then
            # skip the inherited objects instead of writing to (and so copying) every page of them.
            gc.freeze()
            try:
                self._executor.submit(os.getpid).result()
            finally:
                gc.unfreeze()
            self._forked = True
        return self

    def parse(
        self,
        files: Sequence[TraceFile],
        on_error: OnError,
        skipped: list[Skipped],
        idle: Callable[[], object] | None = None,
    ) -> Iterator[tuple[TraceFile, list[ParsedRank]]]:
        """Parsed files in completion order. A failing file raises (``raise``), or is recorded in
        ``skipped`` and yielded with no ranks (``skip``) so progress still counts it. ``idle`` is
        called whenever this process is about to wait for helpers (e.g. to insert what it holds
        meanwhile).

        Raises:
            TracecalError: the first bad file's error under ``raise``.
            WorkerError: a helper process died (killed for memory, crashed).
        """
        small = sum(f.content_bytes for f in files) < PARALLEL_MIN_BYTES and not self._forked
        if self.workers == 1 or len(files) == 1 or small:
            for trace_file in files:
                yield trace_file, self._parse_here(trace_file, on_error, skipped)
            return
        yield from self._parse_shared(files, on_error, skipped, idle)

    @staticmethod
    def _parse_here(trace_file: TraceFile, on_error: OnError, skipped: list[Skipped]) -> list[ParsedRank]:
        try:
            return parse_trace_file(trace_file.path)
        except TracecalError as exc:
            if on_error == "raise":
                raise
            skipped.append(Skipped(trace_file.path, str(exc)))
            return []

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(_PRELOAD)
            self._executor = ProcessPoolExecutor(max_workers=self.workers - 1, mp_context=context)
        return self._executor

    def _parse_shared(
        self,
        files: Sequence[TraceFile],
        on_error: OnError,
        skipped: list[Skipped],
        idle: Callable[[], object] | None,
    ) -> Iterator[tuple[TraceFile, list[ParsedRank]]]:
        """Helpers and this process take files from one queue. A helper gets its next file the moment
        it finishes one (a callback on the executor's thread), so it never waits for this process;
        this process yields its own file and every helper result that is ready between two of its
        files, then waits for the rest."""
        pool = self._pool()
        queue = iter(files)
        lock = threading.Lock()  # the queue and in_flight are shared with the executor's thread
        in_flight: dict[Future[list[ParsedRank]], TraceFile] = {}
        stopping = False

        def take() -> TraceFile | None:
            with lock:
                return None if stopping else next(queue, None)

        def submit(trace_file: TraceFile | None) -> None:
            if trace_file is None:
                return
            future = pool.submit(parse_trace_file, trace_file.path)
            with lock:
                in_flight[future] = trace_file
            future.add_done_callback(lambda done: None if done.cancelled() else submit(take()))

        def ready() -> list[Future[list[ParsedRank]]]:
            with lock:
                return [f for f in in_flight if f.done()]

        def collect(finished: Iterable[Future[list[ParsedRank]]]) -> Iterator[tuple[TraceFile, list[ParsedRank]]]:
            for future in finished:
                with lock:
                    trace_file = in_flight.pop(future)
                try:
                    parsed = future.result()
                except BrokenProcessPool as exc:
                    raise WorkerError(
                        f"{trace_file.path}: a parser process died (out of memory?); retry with fewer --workers"
                    ) from exc
                except TracecalError as exc:
                    if on_error == "raise":
                        raise
                    skipped.append(Skipped(trace_file.path, str(exc)))
                    parsed = []
                yield trace_file, parsed
                del parsed

        # At most one file per parser in flight, and one parsed rank per helper waiting to be taken.
        for _ in range(self.workers - 1):
            submit(take())
        try:
            while (own := take()) is not None:
                yield own, self._parse_here(own, on_error, skipped)
                yield from collect(ready())
            while True:
                with lock:
                    pending = list(in_flight)
                if not pending:
                    break
                if idle is not None and not any(f.done() for f in pending):
                    idle()
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                yield from collect(finished)
        except BaseException:
            with lock:
                stopping = True  # no helper takes another file
                running = list(in_flight)
            for future in running:  # stop queued work; the pool itself is shut down on exit
                future.cancel()
            raise

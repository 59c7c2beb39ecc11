"""Parsing trace files in worker processes, at most one file per worker in flight.

``ParserPool`` is created once per ingest and shared by its runs; its worker processes start on the
first run with several files. Results come back in completion order, so the caller can store each
rank as soon as it is parsed and drop it: neither a worker nor the caller ever holds a whole run.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Sequence
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
"""Below this much uncompressed trace in a run, files are parsed in the calling process: starting the
worker processes (about a second of CPU) would cost more than parsing (~50 MB of JSON per CPU second)."""

_PRELOAD = ["tracecal.ingest.kineto", "pandas"]
"""Imported once in the fork server, so workers forked from it start warm. pandas: pyarrow imports
it on its first ``pa.array()`` of Python objects (0.3 s of CPU) when it is installed."""


@dataclass(frozen=True)
class Skipped:
    """A file or run left out under ``on_error="skip"``, and why."""

    path: Path
    reason: str


class ParserPool:
    """Up to ``workers`` parser processes (``forkserver``: the caller holds a DuckDB connection and
    its threads, which a forked child must not inherit). ``workers <= 1``, a single file, or less than
    ``PARALLEL_MIN_BYTES`` of trace parse in this process."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._executor: ProcessPoolExecutor | None = None

    def __enter__(self) -> ParserPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def parse(
        self, files: Sequence[TraceFile], on_error: OnError, skipped: list[Skipped]
    ) -> Iterator[tuple[TraceFile, list[ParsedRank]]]:
        """Parsed files in completion order. A failing file raises (``raise``), or is recorded in
        ``skipped`` and yielded with no ranks (``skip``) so progress still counts it.

        Raises:
            TracecalError: the first bad file's error under ``raise``.
            WorkerError: a worker process died (killed for memory, crashed).
        """
        if self.workers == 1 or len(files) == 1 or sum(f.content_bytes for f in files) < PARALLEL_MIN_BYTES:
            for trace_file in files:
                yield trace_file, self._parse_here(trace_file, on_error, skipped)
            return
        yield from self._parse_in_workers(files, on_error, skipped)

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
            self._executor = ProcessPoolExecutor(max_workers=self.workers, mp_context=context)
        return self._executor

    def _parse_in_workers(
        self, files: Sequence[TraceFile], on_error: OnError, skipped: list[Skipped]
    ) -> Iterator[tuple[TraceFile, list[ParsedRank]]]:
        pool = self._pool()
        queue = iter(files)
        in_flight: dict[Future[list[ParsedRank]], TraceFile] = {}

        def submit_next() -> None:
            trace_file = next(queue, None)
            if trace_file is not None:
                in_flight[pool.submit(parse_trace_file, trace_file.path)] = trace_file

        # At most one file per worker in flight: a parsed rank waits for the caller, not in a queue.
        for _ in range(self.workers):
            submit_next()
        try:
            while in_flight:
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in finished:
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
                    submit_next()
                    yield trace_file, parsed
                    del parsed
        except BaseException:
            for future in in_flight:  # stop queued work; the pool itself is shut down on exit
                future.cancel()
            raise

"""Where trace files are parsed: this process, a pool of worker processes, or a Dask cluster.

Every executor runs the same task on each file (``FileTask``: by default
``tracecal.ingest.shards.parse_for_loader``; the ingest's task also decodes the ranks it parsed) and
offers the same four things (``FileExecutor``): submit a call, wait for the first of some futures, tell whether an
exception means a worker died, close. ``Parsing`` keeps at most ``capacity`` files of a run in flight
and yields each as it completes, so the loader stores a rank and drops it while the others parse.
The Dask executor lives in ``tracecal.ingest.dask_cluster`` (Dask is an optional dependency).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from tracecal.errors import TracecalError, WorkerError
from tracecal.ingest.discover import TraceFile
from tracecal.ingest.shards import parse_for_loader
from tracecal.ingest.trace import ParsedRank
from tracecal.sources.registry import parser_modules

OnError = Literal["raise", "skip"]

Result = TypeVar("Result")
FileTask = Callable[[TraceFile, Path, bool], list[Result]]
"""``task(trace_file, shard_dir, crosses_processes)``: what a worker does with one file; one result
per rank of the file. A top-level function (or a ``functools.partial`` of one) so it pickles."""


def parse_file(trace_file: TraceFile, shard_dir: Path, crosses_processes: bool) -> list[ParsedRank]:
    """The plain task: parse the file (``parse_for_loader``)."""
    return parse_for_loader(trace_file.path, shard_dir, crosses_processes)


@dataclass(frozen=True)
class Skipped:
    """A file or run left out under ``on_error="skip"``, and why."""

    path: Path
    reason: str


class FileExecutor(Protocol):
    """Runs the per-file task somewhere; ``concurrent.futures``-like.

    Attributes:
        capacity: files in flight at most (bounds the memory of the ranks being parsed).
        crosses_processes: results come from another process, so every rank travels as a shard.
        remedy: what to tell the user when a worker dies.
    """

    capacity: int
    crosses_processes: bool
    remedy: str

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        """Start ``fn(*args)``; a future with ``result()``, ``done()``, ``exception()`` and ``cancel()``."""
        ...

    def wait_first(self, futures: Collection[Any]) -> Collection[Any]:
        """Block until at least one of ``futures`` is done; the done ones."""
        ...

    def worker_died(self, error: BaseException) -> bool:
        """Whether ``error`` (from ``submit`` or a future) means a worker process was lost."""
        ...

    def close(self) -> None: ...


class InProcess:
    """Parses in the calling process, one file at a time (``--workers 1``, or a run of one file)."""

    capacity = 1
    crosses_processes = False
    remedy = "the trace may be too large for this machine's memory"

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # handed over like a worker's error: Parsing raises or skips it
            future.set_exception(exc)
        return future

    def wait_first(self, futures: Collection[Any]) -> Collection[Any]:
        return futures  # all done at submit

    def worker_died(self, error: BaseException) -> bool:
        return False

    def close(self) -> None:
        pass


def warm_modules() -> list[str]:
    """Imported once by the fork server, so each worker process starts with the parsers loaded: every
    file source's parser (``tracecal.sources.registry``) and the shard writer."""
    return [*parser_modules(), "tracecal.ingest.shards"]


class ProcessPool:
    """``workers`` worker processes (``concurrent.futures.ProcessPoolExecutor``), started on the first
    submit. Fork server on Linux, spawn elsewhere: forking a process that has DuckDB threads could
    copy a lock some thread holds, which then stays locked in the child for good."""

    crosses_processes = True
    remedy = "retry with fewer --workers"

    def __init__(self, workers: int, initializer: Callable[..., object] | None = None, initargs: tuple[Any, ...] = ()):
        """``initializer(*initargs)`` runs first in every worker process (a hook for tests and tools)."""
        self.capacity = max(1, workers)
        method = "forkserver" if sys.platform.startswith("linux") else "spawn"
        context = multiprocessing.get_context(method)
        if method == "forkserver":
            context.set_forkserver_preload(warm_modules())
        self._pool = concurrent.futures.ProcessPoolExecutor(
            self.capacity, mp_context=context, initializer=initializer, initargs=initargs
        )

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> concurrent.futures.Future[Any]:
        return self._pool.submit(fn, *args)

    def wait_first(self, futures: Collection[Any]) -> Collection[Any]:
        return concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED).done

    def worker_died(self, error: BaseException) -> bool:
        return isinstance(error, concurrent.futures.process.BrokenProcessPool)

    def close(self) -> None:
        """Cancel queued calls and wait for the running ones (their shards go with the shard directory)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


class Parsing(Generic[Result]):
    """The files of one run, parsed by ``executor`` and yielded in completion order.

    The first ``capacity`` files are submitted at once (they parse while the loader opens its
    transaction); each yielded file makes room for the next. A failing file raises (``raise``) or is
    recorded in ``skipped`` and yielded with no ranks (``skip``), so progress still counts it.
    ``close()`` cancels the files not yet started.

    Raises (from iteration):
        TracecalError: the first bad file's error under ``raise``.
        WorkerError: a worker died; names the file (or the files in flight when it died).
    """

    def __init__(
        self,
        executor: FileExecutor,
        files: Sequence[TraceFile],
        shard_dir: Path,
        on_error: OnError,
        skipped: list[Skipped],
        task: FileTask[Result] = parse_file,  # type: ignore[assignment]
    ) -> None:
        self._executor, self._shard_dir, self._task = executor, shard_dir, task
        self._on_error, self._skipped = on_error, skipped
        self._waiting = iter(files)
        self._pending: dict[Any, TraceFile] = {}
        self._done: list[Any] = []
        for _ in range(executor.capacity):
            self._submit_next()

    def __iter__(self) -> Iterator[tuple[TraceFile, list[Result]]]:
        return self

    def __next__(self) -> tuple[TraceFile, list[Result]]:
        if not self._done:
            if not self._pending:
                raise StopIteration
            self._done = list(self._executor.wait_first(list(self._pending)))
        future = self._done.pop()
        trace_file = self._pending.pop(future)
        try:
            ranks: list[Result] = future.result()
        except TracecalError as exc:
            if self._on_error == "raise":
                raise
            self._skipped.append(Skipped(trace_file.path, str(exc)))
            ranks = []
        except BaseException as exc:
            if self._executor.worker_died(exc):
                raise self._worker_error([trace_file]) from None
            raise
        self._submit_next()
        return trace_file, ranks

    def close(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()

    def _submit_next(self) -> None:
        trace_file = next(self._waiting, None)
        if trace_file is None:
            return
        try:
            future = self._executor.submit(self._task, trace_file, self._shard_dir, self._executor.crosses_processes)
        except Exception as exc:
            if self._executor.worker_died(exc):
                raise self._worker_error([]) from None
            raise
        self._pending[future] = trace_file

    def _worker_error(self, lost: list[TraceFile]) -> WorkerError:
        """The files whose worker died: ``lost``, and those in flight that failed with it (a process
        pool fails every file in flight and cannot tell whose process it was)."""
        for future, trace_file in self._pending.items():
            if future.done() and not future.cancelled() and self._executor.worker_died(future.exception()):
                lost.append(trace_file)
        remedy = self._executor.remedy
        if len(lost) == 1:
            return WorkerError(f"{lost[0].path}: a parser process died while parsing it (out of memory?); {remedy}")
        names = ", ".join(str(f.path) for f in lost) if lost else "none"
        return WorkerError(
            f"a parser process died (out of memory?) while these files were in flight: {names}; {remedy}"
        )

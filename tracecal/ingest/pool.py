"""Parsing trace files in parallel: the calling process and ``workers - 1`` helper processes, each with
at most one file in flight.

``ParserPool`` is created once per ingest and shared by its runs. Results come back in completion
order, so the caller can store each rank as soon as it is parsed and drop it: neither a helper nor
the caller ever holds a whole run.

How a run is shared: ``parse`` sends the run's file list to every helper at once, and every parser
(helpers and the caller) claims the next unparsed file from a counter in shared memory. A helper
therefore starts on the run the moment ``parse`` is called (while the caller opens its transaction)
and takes its next file the moment it finishes one, without waiting for the caller, which is busy
parsing or inserting (no thread of the caller is involved: a reply is read by the caller's own thread
between two of its files, or while it waits). A helper writes each parsed rank's events as an Arrow IPC
stream into a spool file (``/dev/shm`` when it exists: memory, no disk) and sends only the file's name
and the rank's small fields through its pipe, so it does not block on a caller that is not reading
(unless the spool is full: then the table itself is pickled through the pipe); the caller maps the file
(no copy, no unpickling of the columns) and deletes its name at once. A run given up early (an error in
the caller: ``Parsing.close()``, started or not) is stopped by the counter: no parser claims another
of its files, and the replies still in flight are dropped when read. One run is parsed at a time.
Spool directories carry the pool process's pid; one left by a killed process is deleted by the next
pool that starts.

A new helper parses a small synthetic trace once (``_warm_up``) before it waits for work: a
process's first parse pays one-time costs, which otherwise made a helper's first file about twice as
slow as its next ones.

Helpers are started one of two ways:

- ``ParserPool(n).start()`` *before any DuckDB connection is opened in this process* forks them at
  once from the caller (``fork``: the helpers inherit every imported module and start in about a
  millisecond, so even a run of a few 1 MB ranks is worth splitting; ``start`` imports the parser
  first, see ``_PRELOAD``). ``trace-ingest`` calls it before it imports DuckDB, polars
  and the loader: a smaller process forks faster and the caller's later writes copy fewer shared
  pages. Forking is only safe while the process has no DuckDB threads: a thread that holds a lock at
  the moment of the fork leaves it locked forever in the child. The library threads that may exist
  then (the numpy/OpenBLAS and Arrow pools) are idle, and the helpers only run the parsers (msgspec,
  pyarrow, numpy), never DuckDB or polars; Arrow and glibc malloc re-initialise their locks in a
  forked child. The pool forks all helpers on that one call and never again.
- otherwise (a library caller that already holds a connection) helpers come from a ``forkserver``
  on first need, which costs about a second of CPU to import the parser there: only runs of at
  least ``PARALLEL_MIN_BYTES`` use them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import itertools
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import traceback
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Literal, NoReturn

import pyarrow as pa

from tracecal.errors import TracecalError, WorkerError
from tracecal.ingest.discover import TraceFile
from tracecal.ingest.parse import parse_trace_file
from tracecal.ingest.trace import EventsFile, ParsedRank

OnError = Literal["raise", "skip"]
_Parsed = Generator[tuple[TraceFile, list[ParsedRank]], None, None]


class Parsing:
    """The parsed files of one run in completion order (``ParserPool.parse``). ``close()`` gives up
    the run: no parser claims another of its files, whether iteration has started or not (a
    generator that never started would not run its ``finally``)."""

    def __init__(self, parsed: _Parsed, stop: Callable[[], None] | None = None) -> None:
        self._parsed = parsed
        self._stop = stop

    def __iter__(self) -> Parsing:
        return self

    def __next__(self) -> tuple[TraceFile, list[ParsedRank]]:
        return next(self._parsed)

    def close(self) -> None:
        try:
            self._parsed.close()
        finally:
            if self._stop is not None:
                self._stop()


PARALLEL_MIN_BYTES = 64 * 2**20
"""Below this much uncompressed trace in a run, a pool without forked helpers parses in the calling
process: starting fork-server helpers (about a second of CPU) would cost more than parsing (~50 MB of
JSON per CPU second). Forked helpers (``ParserPool.start``) are used for any run of several files."""

_PRELOAD = ["tracecal.ingest.kineto"]
"""Imported before helpers are made, so they start warm: by the caller before ``start`` forks (it
needs them itself), once in the fork server otherwise. ``trace-ingest`` keeps pandas out of pyarrow
before it starts the pool (``tracecal.ingest.no_pandas``), so forked helpers inherit that; a fork
server, started for runs of at least ``PARALLEL_MIN_BYTES``, imports pandas once if it is installed."""

_RUN, _NEXT, _SLOTS = 0, 1, 2
"""The shared counter (``RawArray`` of int64, guarded by one lock): the current run's number, the
index of its next unclaimed file, then per helper the index of the file it is parsing (-1: none)."""

_STOPPED = 2**62

_LOCK_POLL_SECONDS = 0.1
"""While this process waits for the shared lock, how often it checks that no helper died holding it."""

_CLOSE_SECONDS = 1.0
"""How long ``close`` waits for an idle helper to leave before terminating it."""

_SPILL_PREFIX = "tracecal-spill-"

_SPOOL_PREFIX = "tracecal-parse-"
"""Spool directories are named ``tracecal-parse-<pid of the pool's process>-<random>``."""


@dataclass(frozen=True)
class Skipped:
    """A file or run left out under ``on_error="skip"``, and why."""

    path: Path
    reason: str


@dataclass
class _Helper:
    process: Any  # multiprocessing's Process of the chosen context
    conn: Connection


# What a helper sends per file: (run, file index, shipped ranks or None, error or None).
_Shipped = tuple[dict[str, Any], "str | pa.Table | EventsFile"]
_Reply = tuple[int, int, "list[_Shipped] | None", "BaseException | None"]


class ParserPool:
    """``workers`` parsers: this process and ``workers - 1`` helper processes. ``workers <= 1`` or a
    single file parse here only; so do runs under ``PARALLEL_MIN_BYTES`` unless ``start`` forked the
    helpers."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._helpers: list[_Helper] = []
        self._forked = False
        self._lock: Any = None
        self._state: Any = None
        self._spool: Path | None = None
        self._run = 0
        self._active: int | None = None  # the run being parsed (dispatched, not yet stopped)
        self._broken: str | None = None
        self._spill: Path | None = None

    @property
    def helper_pids(self) -> list[int]:
        """Process ids of the live helper processes (none before they start or after ``close``)."""
        return [helper.process.pid for helper in self._helpers if helper.process.pid is not None]

    def __enter__(self) -> ParserPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the helpers and delete the spool directory: the current run (if any) is stopped
        first, so no helper claims another file; one still parsing a file is terminated, and one
        that has not left within ``_CLOSE_SECONDS`` (e.g. still warming up) too."""
        if self._active is not None:
            self._stop(self._active)
        helpers, self._helpers = self._helpers, []
        for index, helper in enumerate(helpers):
            busy = self._state is not None and self._state[_SLOTS + index] >= 0
            if busy:
                helper.process.terminate()
            else:
                with contextlib.suppress(OSError):
                    helper.conn.send(None)
        for helper in helpers:
            helper.process.join(_CLOSE_SECONDS)
            if helper.process.is_alive():
                helper.process.terminate()
                helper.process.join()
            helper.conn.close()
        for directory in (self._spool, self._spill):
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
        self._spool = self._spill = None

    @property
    def spill_dir(self) -> Path:
        """Where parsers write the events of ranks too large to hold (a temporary directory on disk,
        made on first use and removed by ``close``)."""
        if self._spill is None:
            self._spill = Path(tempfile.mkdtemp(prefix=_SPILL_PREFIX))
            weakref.finalize(self, shutil.rmtree, self._spill, True)
        return self._spill

    def start(self) -> ParserPool:
        """Import the parser (``_PRELOAD``: this process needs it too, and so its import is not part
        of the first run's time whatever the worker count), then fork the helper processes; call it
        before opening any DuckDB connection in this process (see the module docstring). Forks
        nothing for one worker, or off Linux (macOS system libraries are not fork-safe; there the
        fork server is used)."""
        for module in _PRELOAD:  # imported once here, inherited by the helpers
            importlib.import_module(module)
        if self.workers > 1 and not self._helpers and sys.platform.startswith("linux"):
            self._launch("fork")
            self._forked = True
        return self

    def _launch(self, method: str) -> None:
        context = multiprocessing.get_context(method)
        if method == "forkserver":
            context.set_forkserver_preload(_PRELOAD)
        shm = Path("/dev/shm")
        parent = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
        _remove_stale_spools(Path(parent or tempfile.gettempdir()))
        self._spool = Path(tempfile.mkdtemp(prefix=f"{_SPOOL_PREFIX}{os.getpid()}-", dir=parent))
        weakref.finalize(self, shutil.rmtree, self._spool, True)  # also if the pool is never closed
        self._lock = context.Lock()
        self._state = context.RawArray("q", _SLOTS + self.workers - 1)
        for slot in range(self.workers - 1):
            self._state[_SLOTS + slot] = -1
        for slot in range(self.workers - 1):
            ours, theirs = context.Pipe()
            process = context.Process(  # type: ignore[attr-defined]
                target=_helper_main,
                args=(slot, theirs, self._lock, self._state, str(self._spool), str(self.spill_dir)),
                name=f"tracecal-parser-{slot + 1}",
                daemon=True,
            )
            # gc.freeze: a forked helper's garbage collections then skip the inherited objects
            # instead of writing to (and so copying) every page of them.
            gc.freeze()
            try:
                process.start()
            finally:
                gc.unfreeze()
            theirs.close()
            self._helpers.append(_Helper(process, ours))

    def parse(
        self,
        files: Sequence[TraceFile],
        on_error: OnError,
        skipped: list[Skipped],
        idle: Callable[[], object] | None = None,
    ) -> Parsing:
        """Parsed files in completion order. The helpers start on ``files`` at once (before the
        first ``next``); an iterator dropped before its end stops them taking more of its files.
        A failing file raises (``raise``), or is recorded in ``skipped`` and yielded with no ranks
        (``skip``) so progress still counts it. ``idle`` (e.g. insert what this process holds) is
        called whenever this process is about to wait for helpers, and before it takes one of the
        run's last files (no more left than there are helpers), so that its work after the last
        file is small.

        Raises:
            TracecalError: the first bad file's error under ``raise``.
            WorkerError: a helper process died (killed for memory, crashed).
        """
        small = not self._forked and sum(f.content_bytes for f in files) < PARALLEL_MIN_BYTES
        if self.workers == 1 or len(files) == 1 or small:
            return Parsing(self._parse_all_here(files, on_error, skipped))
        if self._broken is not None:
            raise WorkerError(self._broken)
        if self._active is not None:  # its iterator would wait for replies the helpers never send
            raise RuntimeError("ParserPool parses one run at a time: close() the previous run's Parsing first")
        if not self._helpers:
            self._launch("forkserver")
        run = self._dispatch(files)
        return Parsing(self._parse_shared(run, files, on_error, skipped, idle), stop=lambda: self._stop(run))

    def _parse_all_here(self, files: Sequence[TraceFile], on_error: OnError, skipped: list[Skipped]) -> _Parsed:
        for trace_file in files:
            yield trace_file, self._parse_here(trace_file, on_error, skipped)

    def _parse_here(self, trace_file: TraceFile, on_error: OnError, skipped: list[Skipped]) -> list[ParsedRank]:
        try:
            return parse_trace_file(trace_file.path, self.spill_dir)
        except TracecalError as exc:
            if on_error == "raise":
                raise
            skipped.append(Skipped(trace_file.path, str(exc)))
            return []

    @contextlib.contextmanager
    def _locked(self, files: Sequence[TraceFile] = ()) -> Iterator[None]:
        """The shared lock. A helper killed while it holds the lock (between the lines of a claim)
        leaves it locked for good, so the wait gives up once a helper is dead (``WorkerError``)."""
        while not self._lock.acquire(timeout=_LOCK_POLL_SECONDS):
            dead = next((helper for helper in self._helpers if not helper.process.is_alive()), None)
            if dead is not None:
                self._died(dead, files)
        try:
            yield
        finally:
            self._lock.release()

    def _dispatch(self, files: Sequence[TraceFile]) -> int:
        """Make ``files`` the current run (any earlier one is abandoned) and send it to every helper."""
        with self._locked(files):
            self._run = int(self._state[_RUN]) + 1
            self._state[_RUN], self._state[_NEXT] = self._run, 0
        self._active = self._run
        paths = [f.path for f in files]
        for helper in self._helpers:
            try:
                helper.conn.send((self._run, paths))
            except OSError:
                self._died(helper, files)
        return self._run

    def _claim(self, run: int, files: Sequence[TraceFile]) -> int | None:
        """The next unclaimed file of ``run`` for this process, or None when every file is taken."""
        with self._locked(files):
            index = int(self._state[_NEXT])
            if self._state[_RUN] != run or index >= len(files):
                return None
            self._state[_NEXT] = index + 1
            return index

    def _unclaimed(self, total: int) -> int:
        return max(0, total - int(self._state[_NEXT]))

    def _stop(self, run: int) -> None:
        """No parser claims another file of ``run`` (finished or given up); the pool is free again.
        If a helper died holding the lock, the pool is broken (``_broken``) and takes no more runs."""
        with contextlib.suppress(WorkerError), self._locked():
            if self._state[_RUN] == run:
                self._state[_NEXT] = _STOPPED
        if self._active == run:
            self._active = None

    def _parse_shared(
        self,
        run: int,
        files: Sequence[TraceFile],
        on_error: OnError,
        skipped: list[Skipped],
        idle: Callable[[], object] | None,
    ) -> _Parsed:
        """Between two of its own files this process yields every helper result that has arrived;
        when no file is left to claim it waits for the helpers' last ones (calling ``idle`` first).
        The helpers never wait for this process: they claim files themselves."""
        remaining = len(files)
        try:
            while remaining:
                for index, parsed in self._replies(run, files, on_error, skipped, timeout=0):
                    remaining -= 1
                    yield files[index], parsed
                    del parsed
                if not remaining:
                    break
                if idle is not None and self._unclaimed(len(files)) <= len(self._helpers):
                    # The run's last files: insert what is held now, while the helpers parse,
                    # rather than all of it after the last file.
                    idle()
                own = self._claim(run, files)
                if own is not None:
                    remaining -= 1
                    yield files[own], self._parse_here(files[own], on_error, skipped)
                    continue
                if idle is not None and not self._any_ready():
                    idle()
                for index, parsed in self._replies(run, files, on_error, skipped, timeout=None):
                    remaining -= 1
                    yield files[index], parsed
                    del parsed
        finally:
            self._stop(run)  # after an error: no parser takes another file of this run

    def _any_ready(self) -> bool:
        return bool(wait([h.conn for h in self._helpers], 0))

    def _replies(
        self,
        run: int,
        files: Sequence[TraceFile],
        on_error: OnError,
        skipped: list[Skipped],
        timeout: float | None,
    ) -> list[tuple[int, list[ParsedRank]]]:
        """The results of ``run`` that have arrived, after waiting up to ``timeout`` seconds for one
        (None: until one arrives); replies of an abandoned run are dropped."""
        waitables: list[Any] = [h.conn for h in self._helpers] + [h.process.sentinel for h in self._helpers]
        ready = set(wait(waitables, timeout))
        results: list[tuple[int, list[ParsedRank]]] = []
        for helper in self._helpers:
            if helper.conn not in ready and helper.process.sentinel not in ready:
                continue
            while True:
                try:
                    if not helper.conn.poll():
                        break
                    reply: _Reply = helper.conn.recv()
                except (EOFError, OSError):
                    self._died(helper, files)
                reply_run, index, shipped, error = reply
                if reply_run != run:
                    _discard(shipped)
                    continue
                if error is not None:
                    if on_error == "raise" or not isinstance(error, TracecalError):
                        raise error
                    skipped.append(Skipped(files[index].path, str(error)))
                    results.append((index, []))
                else:
                    results.append((index, [_receive(s) for s in shipped or ()]))
            if helper.process.sentinel in ready and not helper.process.is_alive():
                self._died(helper, files)
        return results

    def _died(self, helper: _Helper, files: Sequence[TraceFile]) -> NoReturn:
        """A helper is gone: the pool cannot finish the run (nor any later one)."""
        slot = self._helpers.index(helper)
        index = int(self._state[_SLOTS + slot])
        where = f"{files[index].path}: " if 0 <= index < len(files) else ""
        self._broken = f"{where}a parser process died (out of memory?); retry with fewer --workers"
        raise WorkerError(self._broken)


def _remove_stale_spools(parent: Path) -> None:
    """Delete spool directories left by pool processes that no longer exist (killed before they
    could clean up: in ``/dev/shm`` they would hold memory until the next boot)."""
    for spool in parent.glob(f"{_SPOOL_PREFIX}*-*"):
        pid = spool.name.removeprefix(_SPOOL_PREFIX).partition("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(spool, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def _helper_main(slot: int, conn: Connection, lock: Any, state: Any, spool: str, spill: str) -> None:
    """A helper process: for each run it is sent, parse the files it claims until none is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle (it stops us)
    _warm_up(Path(spool))
    names = itertools.count()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        run, paths = task
        while True:
            with lock:
                index = int(state[_NEXT])
                if state[_RUN] != run or index >= len(paths):
                    break
                state[_NEXT] = index + 1
                state[_SLOTS + slot] = index
            reply: _Reply
            try:
                parsed = parse_trace_file(paths[index], Path(spill))  # looked up at call time (tests patch it)
                reply = (run, index, [_ship(r, Path(spool), next(names)) for r in parsed], None)
                del parsed
            except Exception as exc:  # sent to the caller, which raises or skips it
                reply = (run, index, None, _portable(exc))
            conn.send(reply)
            del reply
            with lock:
                state[_SLOTS + slot] = -1


_WARM_UP_EVENTS: list[dict[str, Any]] = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2,
     "args": {"External id": 1, "Input Dims": [[2, 2], [2, 2]], "Input type": ["float", "float"]}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2, "dur": 1,
     "args": {"correlation": 7, "External id": 1}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 3, "dur": 4,
     "args": {"correlation": 7, "stream": 7, "device": 0, "grid": [1, 1, 1], "block": [128, 1, 1]}},
    {"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1, "ts": 1, "dur": 9, "args": {"Python id": 3}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
]  # fmt: skip


WARM_UP_REPEATS = 500
"""The warm-up trace is ``_WARM_UP_EVENTS`` this many times (2 500 events, as many as a small real
rank): its parse grows the helper's heap to a real file's working size, which the next parses reuse;
fewer repeats left the first real file still slow, more gained nothing. The warm-up runs while the
caller imports DuckDB and opens its database, so it costs the caller no time."""


def _warm_up(spool: Path) -> None:
    """Parse and ship a synthetic trace once, before the first real file: a process's first parse
    pays one-time costs (first calls into msgspec, ISA-L, numpy, Arrow and its IPC writer, fresh heap
    pages), which made a forked helper's first file take about twice as long as its next ones. Done
    while the caller opens its database; never fails the pool."""
    import gzip
    import json

    path = spool / f"warm-up-{os.getpid()}.json.gz"
    try:
        events = [{**event, "ts": event["ts"] + 10 * i} for i in range(WARM_UP_REPEATS) for event in _WARM_UP_EVENTS]
        path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode(), compresslevel=1))
        for rank in parse_trace_file(path):
            _discard([_ship(rank, spool, -1)])
    except Exception:  # only a warm-up: the real files report their own errors
        pass
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def _ship(rank: ParsedRank, spool: Path, number: int) -> _Shipped:
    """A parsed rank for the pipe: its small fields, and its events as the name of an Arrow IPC
    stream file in the spool (or, if that cannot be written, the table itself, pickled)."""
    fields = {f.name: getattr(rank, f.name) for f in dataclasses.fields(rank) if f.name != "events"}
    if isinstance(rank.events, EventsFile):  # already on disk
        return fields, rank.events
    path = spool / f"{os.getpid()}-{number}.arrows"
    try:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, rank.events.schema) as writer:
            writer.write_table(rank.events)
    except (OSError, pa.ArrowException):  # e.g. a full /dev/shm
        with contextlib.suppress(OSError):
            path.unlink()
        return fields, rank.events
    return fields, str(path)


def _receive(shipped: _Shipped) -> ParsedRank:
    fields, events = shipped
    if isinstance(events, str):
        path = events
        # Memory-mapped: the table's buffers point into the file (no copy); the mapping outlives
        # the name, which goes at once.
        events = pa.ipc.open_stream(pa.memory_map(path)).read_all()
        os.unlink(path)
    return ParsedRank(events=events, **fields)


def _discard(shipped: list[_Shipped] | None) -> None:
    for _, events in shipped or ():
        if isinstance(events, (str, EventsFile)):
            with contextlib.suppress(OSError):
                os.unlink(events.path if isinstance(events, EventsFile) else events)


def _portable(exc: Exception) -> BaseException:
    """A helper's error for the pipe: a ``TracecalError`` as it is (its one-line message is the
    report); anything else (a bug) as a ``RuntimeError`` carrying the helper's traceback."""
    if isinstance(exc, TracecalError):
        try:
            return pickle.loads(pickle.dumps(exc))
        except Exception:  # an error class with an unusual constructor
            return TracecalError(str(exc))
    return RuntimeError("in a parser process:\n" + "".join(traceback.format_exception(exc)))

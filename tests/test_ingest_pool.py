"""The parser pool's life cycle: giving up a run, one run at a time, a helper that dies, stale spools."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import KINETO
from tracecal.errors import WorkerError
from tracecal.ingest import pool
from tracecal.ingest.discover import discover_run
from tracecal.ingest.parse import parse_trace_file
from tracecal.ingest.trace import ParsedRank

FILES = discover_run(KINETO / "dlrm_8rank").files
TEST_PID = os.getpid()


def _is_warm_up(path: Path) -> bool:
    return Path(path).name.startswith("warm-up")


def test_a_run_given_up_before_its_first_file_stops_the_helpers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Parsing.close()`` on an iterator never started still stops the run: the helper finishes the
    file it holds and claims no other (a generator that never started would not run its finally)."""
    log = tmp_path / "parsed.log"

    def slow_parse(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
        if not _is_warm_up(path):
            with log.open("a") as out:
                out.write(f"{Path(path).name}\n")
        time.sleep(0.3)
        return parse_trace_file(path)

    monkeypatch.setattr(pool, "parse_trace_file", slow_parse)  # inherited by the forked helper
    parsers = pool.ParserPool(2).start()
    try:
        parsing = parsers.parse(FILES, "raise", [])
        time.sleep(0.5)  # the helper warms up and takes its first file
        parsing.close()
        time.sleep(1.0)  # unstopped, the helper would have taken three more files by now
        taken = log.read_text().splitlines() if log.exists() else []
    finally:
        started = time.perf_counter()
        parsers.close()
        closing = time.perf_counter() - started
    assert len(taken) <= 2, taken
    assert closing < 1.0


def test_the_pool_parses_one_run_at_a_time() -> None:
    with pool.ParserPool(2).start() as parsers:
        first = parsers.parse(FILES, "raise", [])
        with pytest.raises(RuntimeError, match="one run at a time"):
            parsers.parse(FILES, "raise", [])
        first.close()
        again = parsers.parse(FILES, "raise", [])
        assert sorted(f.path.name for f, _ in again) == sorted(f.path.name for f in FILES)
        again.close()


def test_a_helper_that_dies_is_one_error_and_the_pool_takes_no_more_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def fatal_in_helper(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
        if os.getpid() != TEST_PID and not _is_warm_up(path):
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
        time.sleep(0.1)  # this process is slow, so the helper surely takes a file
        return parse_trace_file(path)

    monkeypatch.setattr(pool, "parse_trace_file", fatal_in_helper)
    with pool.ParserPool(2).start() as parsers:
        with pytest.raises(WorkerError, match="parser process died"):
            list(parsers.parse(FILES, "raise", []))
        with pytest.raises(WorkerError, match="parser process died"):
            parsers.parse(FILES, "raise", [])


def test_a_helper_killed_while_holding_the_shared_lock_is_one_error_not_a_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A helper SIGKILLed while it holds the pool's lock (a claim is two lines under it) leaves the lock
    held for good: the caller, which then stops the run under that lock, must give up once it sees the
    helper dead instead of waiting forever."""
    parsers = pool.ParserPool(2)

    def die_holding_the_lock(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
        if os.getpid() != TEST_PID and not _is_warm_up(path):
            parsers._lock.acquire()  # the lock exists before the helpers are forked
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.1)  # this process is slow, so the helper surely takes a file
        return parse_trace_file(path)

    monkeypatch.setattr(pool, "parse_trace_file", die_holding_the_lock)
    parsers.start()
    errors: list[BaseException] = []

    def parse_the_run() -> None:
        try:
            list(parsers.parse(FILES, "raise", []))
        except BaseException as exc:  # whatever it is, the test reports it
            errors.append(exc)

    caller = threading.Thread(target=parse_the_run, daemon=True)
    caller.start()
    caller.join(10)
    if caller.is_alive():  # hung on the lock: close() would hang too, so only the helpers go
        for helper in parsers._helpers:
            helper.process.kill()
        pytest.fail("the caller waited forever for the lock the dead helper held")
    parsers.close()
    assert len(errors) == 1 and isinstance(errors[0], WorkerError), errors
    assert "parser process died" in str(errors[0])
    with pytest.raises(WorkerError, match="parser process died"):
        parsers.parse(FILES, "raise", [])


def test_a_spool_left_by_a_dead_process_is_removed_and_a_live_one_kept() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    stale = parent / f"{pool._SPOOL_PREFIX}{gone.pid}-left-by-a-test"
    live = parent / f"{pool._SPOOL_PREFIX}{os.getpid()}-kept-by-a-test"
    for spool in (stale, live):
        spool.mkdir()
        (spool / "0-0.arrows").write_bytes(b"rank")
    try:
        with pool.ParserPool(2).start():
            pass
        assert not stale.exists()
        assert (live / "0-0.arrows").exists()
    finally:
        for spool in (stale, live):
            for f in spool.glob("*"):
                f.unlink()
            if spool.exists():
                spool.rmdir()


def test_ranks_come_through_the_pipe_when_the_spool_cannot_be_written(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    def slow_here(path: Path, spill_dir: Path | None = None) -> list[ParsedRank]:
        if os.getpid() == TEST_PID:
            time.sleep(0.05)  # so the helper surely takes files
        return [replace(r, metadata={**r.metadata, "parsed_by": os.getpid()}) for r in parse_trace_file(path)]

    monkeypatch.setattr(pool.pa, "OSFile", no_space)  # inherited by the forked helper
    monkeypatch.setattr(pool, "parse_trace_file", slow_here)
    with pool.ParserPool(2).start() as parsers:
        parsed = {f.path: ranks for f, ranks in parsers.parse(FILES, "raise", [])}
    assert {r.metadata["parsed_by"] for ranks in parsed.values() for r in ranks} - {TEST_PID}  # helper-shipped
    monkeypatch.undo()
    for path, ranks in parsed.items():
        (direct,) = parse_trace_file(path)
        assert [r.events.equals(direct.events) for r in ranks] == [True], path.name

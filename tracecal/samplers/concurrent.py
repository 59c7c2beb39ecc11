"""Time compute points in several processes at once: sampling under the contention of R local ranks.

A workload that runs R ranks as R processes on one node (the reference workload on a CPU host, or R
GPUs' host threads) times every operator while R−1 other processes compete for the node's cores,
caches and memory bandwidth. Samples taken by one lone process miss that contention; with
``processes = R`` the sampler runs R worker processes, each with the sampler's thread count (one by
default, like a rank), which pull points from one shared queue — so while one worker times a point
the others time theirs, as the ranks run different operators at the same time.

Contract of ``measure_concurrently(todo, measure, processes, scope)``: every ``(point, sample_id)``
of ``todo`` is measured exactly once by ``measure(point, sample_id)`` in one of ``processes`` worker
processes (forked where the platform allows, so they inherit the imported torch), each inside
``scope()``; the results ``(point, row-or-skip-reason)`` are yielded in the parent as they finish (in
completion order), so the caller writes them as before (only the parent touches the database). When
the caller stops early (an error, Ctrl-C) the workers are terminated. Once the queue is empty the
last points run with fewer concurrent workers: at most ``processes − 1`` points are timed with less
contention than the rest.
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from tracecal.errors import SampleError
from tracecal.samplers.grid import GridPoint

Measure = Callable[[GridPoint, str], "dict[str, Any] | str"]

_POLL_S = 1.0
"""How often the parent checks that its workers are alive while it waits for a result."""


def _context() -> Any:
    # fork: workers inherit the imported torch and the caller's closures (seconds per worker saved);
    # spawn where fork does not exist (the arguments are then pickled).
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _worker(
    todo: Sequence[tuple[GridPoint, str]],
    tasks: Any,
    results: Any,
    measure: Measure,
    scope: Callable[[], AbstractContextManager[Any]],
) -> None:
    with scope():
        while True:
            index = tasks.get()
            if index is None:
                return
            point, sid = todo[index]
            try:
                outcome: dict[str, Any] | str = measure(point, sid)
            except SampleError as exc:  # a broken timer: the parent stops the whole run
                results.put((index, None, str(exc)))
                return
            results.put((index, outcome, None))


def measure_concurrently(
    todo: Sequence[tuple[GridPoint, str]],
    measure: Measure,
    processes: int,
    scope: Callable[[], AbstractContextManager[Any]],
) -> Iterator[tuple[GridPoint, dict[str, Any] | str]]:
    """Measure ``todo`` in ``processes`` concurrent worker processes; yield ``(point, outcome)``.

    Raises:
        SampleError: ``processes`` < 1, a worker raised SampleError (its message), or a worker died
            without reporting (its exit code).
    """
    if processes < 1:
        raise SampleError(f"--processes must be ≥ 1, not {processes}")
    if not todo:
        return
    ctx = _context()
    tasks, results = ctx.Queue(), ctx.Queue()
    for index in range(len(todo)):
        tasks.put(index)
    workers = [
        ctx.Process(target=_worker, args=(todo, tasks, results, measure, scope), daemon=True)
        for _ in range(min(processes, len(todo)))
    ]
    for _ in workers:
        tasks.put(None)  # one stop mark per worker, after every point
    for w in workers:
        w.start()
    try:
        for _ in range(len(todo)):
            index, outcome, error = _next_result(results, workers)
            if error is not None:
                raise SampleError(error)
            yield todo[index][0], outcome
        for w in workers:
            w.join()
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
                w.join()
        tasks.close()
        results.close()


def _next_result(results: Any, workers: list[Any]) -> tuple[int, Any, str | None]:
    while True:
        try:
            item: tuple[int, Any, str | None] = results.get(timeout=_POLL_S)
            return item
        except queue.Empty:
            dead = [w for w in workers if w.exitcode not in (None, 0)]
            if dead:
                raise SampleError(
                    f"a sampler worker process died (exit code {dead[0].exitcode}); rerun to resume, or use "
                    "--processes 1"
                ) from None
            if all(w.exitcode == 0 for w in workers):  # all done cleanly, yet a result is missing
                try:
                    item = results.get(timeout=_POLL_S)
                    return item
                except queue.Empty:
                    raise SampleError("sampler workers finished without reporting every point") from None

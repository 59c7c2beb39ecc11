"""Parsing on a Dask cluster: ``--dask local`` (a ``LocalCluster``) or ``--dask ADDRESS`` (a scheduler).

Dask is optional (``pip install 'tracecal[dask]'``), so it is imported when a cluster is asked for.
The workers run the same task as the process pool and write every rank into the shard directory,
which must therefore be a filesystem the workers and the loader share; so must the trace files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from tracecal.errors import TracecalError
from tracecal.ingest.discover import TraceFile

INSTALL_HINT = "--dask needs Dask, which is not installed: pip install 'tracecal[dask]'"

LOCAL_CLUSTER_CONFIG = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
}
"""Dask configuration of ``--dask local``'s cluster, which has no dashboard to read what Dask collects
for one:

- workers spawned without Dask's default ``MALLOC_TRIM_THRESHOLD_``, which fixes glibc's thresholds (it
  gives every free page back and maps every large block afresh), so that a worker reuses its heap as a
  pool process does instead of page-faulting through every chunk of a streamed parse;
- no statistical profiler in the workers (Dask's samples the task thread's stack every 10 ms);
- an event-loop watchdog that ticks once a second (Dask's ticks every 20 ms); it still warns of a
  loop blocked for seconds.

The last two wake the workers' and the scheduler's event loops, which take the GIL from the parse
and, with as many workers as cores, a core from the other workers. Set the same on the workers of a
cluster of your own (docs/scale-out.md)."""


class DaskExecutor:
    """A ``FileExecutor`` over a ``distributed.Client``. ``capacity``: the cluster's worker threads
    when it has any yet (an adaptive cluster may start with none), else ``workers``."""

    crosses_processes = True
    remedy = "give the Dask workers more memory (or fewer threads per worker)"

    def __init__(self, client: Any, workers: int, cluster: Any = None) -> None:
        """``cluster``: a cluster made for this ingest, closed with the executor."""
        import distributed

        self._distributed = distributed
        self.client, self._cluster = client, cluster
        self.capacity = max(1, sum(client.nthreads().values()) or workers)

    def __enter__(self) -> DaskExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        # Absolute paths: a worker's working directory is not the loader's.
        return self.client.submit(fn, *(_absolute(arg) for arg in args), pure=False)

    def wait_first(self, futures: Collection[Any]) -> Collection[Any]:
        done: Collection[Any] = self._distributed.wait(list(futures), return_when="FIRST_COMPLETED").done
        return done

    def worker_died(self, error: BaseException) -> bool:
        return isinstance(error, self._distributed.KilledWorker)

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def _absolute(arg: Any) -> Any:
    """A path (or a trace file's path) made absolute; any other argument as it is."""
    if isinstance(arg, Path):
        return arg.absolute()
    if isinstance(arg, TraceFile):
        return dataclasses.replace(arg, path=arg.path.absolute())
    return arg


def dask_executor(target: str, workers: int) -> DaskExecutor:
    """``target`` ``local``: a ``LocalCluster`` of ``workers`` single-threaded worker processes;
    otherwise the address of a running scheduler (``tcp://host:8786``).

    Raises:
        TracecalError: Dask is not installed (the message says how to install it), or the scheduler
            cannot be reached.
    """
    try:
        import distributed
    except ImportError:
        raise TracecalError(INSTALL_HINT) from None
    if target == "local":
        import dask

        with dask.config.set(LOCAL_CLUSTER_CONFIG):  # read when the scheduler and the workers start, here
            cluster = distributed.LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
            )
        return DaskExecutor(distributed.Client(cluster), workers, cluster)
    try:
        client = distributed.Client(target, timeout="30s")
    except (OSError, TimeoutError) as exc:
        raise TracecalError(f"--dask {target}: cannot reach a Dask scheduler there ({exc})") from None
    return DaskExecutor(client, workers)

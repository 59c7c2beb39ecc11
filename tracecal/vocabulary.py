"""The words every layer of tracecal shares: the kinds of events, and a run's parallel layout.

Any package may import this module and it imports none of theirs (an import-linter contract in
pyproject.toml), so each word is defined once, below every layer that uses it. The columns tracecal
stores, with their types and documentation, are declared in ``tracecal.schema`` (the shape features
once, as ``SHAPE_COLUMNS``, and the collective features as ``COMM_COLUMNS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# --- event kinds (the normalised ``events.kind``) ---------------------------------------------------

GPU_ACTIVITY_KINDS = ("kernel", "memcpy", "memset")
"""The GPU work a CPU launches: a kernel, a copy or a fill, run on a device stream and linked to the
runtime call that launched it. Decode links these to their CPU operators (``operators`` rows of these
kinds); the replay puts them on stream lanes and times them with the calibrated models."""

RUNTIME_KINDS = ("cuda_runtime", "cuda_driver")
"""The CPU-side API calls that launch GPU activities (matched to them by ``correlation``)."""

DEVICE_TRACK_KINDS = frozenset({*GPU_ACTIVITY_KINDS, "gpu_user_annotation", "sync"})
"""Kinds whose ``pid``/``tid`` are a device and a stream (so ``device``/``stream`` are filled, and an
export draws them on the stream's track): the GPU activities, plus two marks the profiler draws on a
stream that are no work of their own, so they are not ``GPU_ACTIVITY_KINDS``: a ``gpu_user_annotation``
(a user range spanning the kernels inside it) and a ``sync`` (a CUDA synchronisation, the time the CPU
waited on the stream). Counted as activities, the kernels under an annotation would be linked and
replayed twice."""


# --- parallel layout --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParallelLayout:
    """PP × TP × DP, nodes × GPUs per node and the world size, with where they came from (the
    ``runs`` row's layout columns). Unknown values are None.

    Discovery fills what the run directory says (``tracecal.ingest.discover``); the ingest sets
    ``world_size`` once the ranks are parsed, and decode reads the layout to tell collective roles
    (``tracecal.decode.collectives``).
    """

    pp: int | None = None
    tp: int | None = None
    dp: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    model: str | None = None
    source: str | None = None
    metadata: dict[str, Any] | None = None
    world_size: int | None = None

    @property
    def known(self) -> bool:
        return self.pp is not None and self.tp is not None

    def merged(self, fallback: ParallelLayout) -> ParallelLayout:
        """This layout, with fields it leaves unknown taken from ``fallback``."""
        values = {
            name: getattr(self, name) if getattr(self, name) is not None else getattr(fallback, name)
            for name in ("pp", "tp", "dp", "nodes", "gpus_per_node", "model", "metadata", "world_size")
        }
        return ParallelLayout(**values, source=self.source or fallback.source)

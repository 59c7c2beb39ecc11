"""The reference training workload: a small GPT trained with real pipeline (1F1B, send/recv), tensor
(column/row-parallel linears + all-reduce) and data (bucketed gradient all-reduce) parallelism through
``torch.distributed``, profiled with torch.profiler — one Kineto trace per rank plus ``run.json``.

``python -m tracecal.workload`` is one rank under ``torchrun``; ``run_local`` (and
``tracecal workload run``) spawns the ranks on this machine. Importing this package does not import
torch: the training code (``train``, ``model``, ``parallel``, ``schedule``) is loaded only in the ranks.
"""

from tracecal.workload.config import TINY, TINY_LAYOUTS, WorkloadConfig
from tracecal.workload.launch import LocalRun, run_local

__all__ = ["TINY", "TINY_LAYOUTS", "LocalRun", "WorkloadConfig", "run_local"]

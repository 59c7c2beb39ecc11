"""Which `Session` method each CLI command calls: the documented map a test holds the CLI to.

Keys are command paths as typed after ``tracecal`` (``"samples import"``); values are method names of
`tracecal.api.Session`. The console scripts are the same commands: ``trace-ingest`` is ``ingest`` and
``calibrate`` is ``calibrate``. ``NOT_IN_API`` names the commands that have no method yet and why;
`tests/test_api.py` fails when a command is in neither, or a mapped method does not exist.
"""

from __future__ import annotations

COMMAND_METHODS: dict[str, str] = {
    "sql": "sql",
    "runs": "runs",
    "ingest": "ingest",
    "iterations": "iterations",
    "predict": "predict",
    "validate": "validate",
    "calibrate": "calibrate",
    "export": "export",
    "diff": "diff",
    "search": "search",
    "samples import": "samples_import",
    "samples export": "samples_export",
    "samples list": "samples_list",
    "samples flag": "samples_flag",
}
"""CLI command -> `Session` method."""

CONSOLE_SCRIPTS: dict[str, str] = {"trace-ingest": "ingest", "calibrate": "calibrate"}
"""Console script -> the `tracecal` command it runs."""

NOT_IN_API: dict[str, str] = {
    "demo": "the whole loop on a local GPU (train, ingest, sample, calibrate, predict); its steps are API calls",
    "workload run": "launches the reference training workload under torchrun; a process, not a database step",
    "samples measure compute": "microbenchmarks on the local GPU; the sampler's loop is not yet behind the API",
    "samples measure comm": "NCCL microbenchmarks under torchrun; the sampler's loop is not yet behind the API",
    "sample compute": "the hidden pre-0.2 spelling of `samples measure compute`",
    "sample comm": "the hidden pre-0.2 spelling of `samples measure comm`",
}
"""Commands without a `Session` method yet, and why."""

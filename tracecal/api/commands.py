"""Which `Session` method each CLI command calls: the documented map a test holds the CLI to.

Keys are command paths as typed after ``tracecal`` (``"samples import"``); values are method names of
`tracecal.api.Session`. The console scripts are the same commands: ``trace-ingest`` is ``ingest`` and
``calibrate`` is ``calibrate``. Every command has its method; `tests/test_api.py` fails when a command
is missing here, a mapped method does not exist, or the command's module does not call it.
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
    "samples measure compute": "samples_measure_compute",
    "samples measure comm": "samples_measure_comm",
    "sample compute": "samples_measure_compute",  # the hidden pre-0.2 spelling
    "sample comm": "samples_measure_comm",
    "workload run": "workload_run",
    "demo": "demo",
}
"""CLI command -> `Session` method."""

CONSOLE_SCRIPTS: dict[str, str] = {"trace-ingest": "ingest", "calibrate": "calibrate"}
"""Console script -> the `tracecal` command it runs."""

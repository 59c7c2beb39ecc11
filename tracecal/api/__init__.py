"""The Python API: one `Session` per database, one method per CLI command (see `tracecal.api.commands`).

    import tracecal
    tc = tracecal.open("/tmp/x.duckdb")
    tc.ingest("../shared/data/traces/kineto/dlrm_8rank")
    tc.predict("dlrm_8rank", mode="measured")   # a polars DataFrame

The API sits between the CLI and the cores: the CLI parses options, calls a `Session` method and renders
what it returns. Methods raise `tracecal.errors.TracecalError` subclasses and never print; long steps
take an optional progress callback.
"""

from __future__ import annotations

from tracecal.api.session import Session, open

__all__ = ["Session", "open"]

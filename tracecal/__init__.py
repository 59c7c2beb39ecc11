"""tracecal: profiler-trace ingestion, calibration and replay prediction for distributed LLM training.

``tracecal.open(db)`` gives a `tracecal.api.Session`, whose methods mirror the CLI (docs/api.md). It
is imported on first use, so ``import tracecal`` (and ``tracecal --help``) loads nothing else.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: `import tracecal` imports nothing else
if TYPE_CHECKING:
    from tracecal.api import Session, open

__version__ = "0.1.0"
__all__ = ["Session", "__version__", "open"]


def __getattr__(name: str) -> object:
    if name in ("open", "Session"):
        from tracecal import api

        return getattr(api, name)
    raise AttributeError(f"module 'tracecal' has no attribute {name!r}")

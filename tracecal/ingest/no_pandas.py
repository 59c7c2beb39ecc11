"""Keeping pandas out of a parsing process: pyarrow would import it for nothing.

When pandas is installed, pyarrow imports it on its first ``pa.array()`` — to recognise pandas Series
and Index among the inputs — which costs 0.15-0.3 s of CPU, more than parsing and loading a whole
small run (``trace-ingest`` of dlrm_8rank: 1.10 s wall with it, 0.91 s without). tracecal's parsers
and loader never hand pyarrow a pandas object. ``keep_pandas_out_of_pyarrow`` lets pyarrow's one-time
probe find pandas missing; pyarrow then never looks again for array-likes, while an explicit
conversion (``Table.to_pandas()``) still imports pandas when it is called.

It changes pyarrow for the whole process — until the first explicit pandas conversion, ``pa.array()``
treats a pandas Series as a plain sequence (a categorical becomes its values) — so it is called by the
process's owner: ``trace-ingest`` before anything else, and the benchmarks that stand in for it; the
library (``ingest_runs``, ``ParserPool``) leaves a caller's process as it is.

pandas used to bring ``numpy.ma`` along. pyarrow tests every numpy input against
``np.ma.MaskedArray``, and numpy imports that submodule on first touch, which without pandas would
happen inside the first parse and slow it: it is imported here, with the parser.
"""

from __future__ import annotations

import importlib.abc
import sys

import numpy.ma  # noqa: F401  (see the module docstring)
import pyarrow as pa


class _PandasMissing(importlib.abc.MetaPathFinder):
    """Answers an import of pandas (and only of pandas) with ModuleNotFoundError."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is kept out of pyarrow's probe by tracecal's parsers", name=name)


def keep_pandas_out_of_pyarrow() -> None:
    """Let pyarrow's pandas probe (the first ``pa.array()`` of the process) find pandas missing.

    Does nothing when pandas is already imported (pyarrow then uses it as usual) or pyarrow has
    already probed. Call it before other threads start: for the moment of the probe, an import of
    pandas anywhere in the process fails."""
    if "pandas" in sys.modules:
        return
    finder = _PandasMissing()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([])
    finally:
        sys.meta_path.remove(finder)

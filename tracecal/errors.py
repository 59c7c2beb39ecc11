"""The exceptions tracecal raises on purpose.

Every failure a user can cause (a bad path, a broken trace, a missing model) is a `TracecalError`
whose message is one line that names the file or object and says what to do. The CLI catches
`TracecalError` and prints only the message; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class TracecalError(Exception):
    """Base class: a user-facing failure with a one-line, actionable message."""


class InputNotFoundError(TracecalError):
    """A path given on the command line does not exist, or holds no trace files."""


class TraceFormatError(TracecalError):
    """A file exists but is not a readable trace: corrupt gzip, truncated or invalid JSON,
    JSON that is not a Kineto trace, an SQLite file that is not an Nsight Systems export,
    or a required field missing (the message names file, event index and key)."""


class RankConflictError(TracecalError):
    """A run's rank cannot be determined, or two files of one run claim the same rank."""


class RunNotFoundError(TracecalError):
    """A command names a run id that is not in the database."""


class SchemaError(TracecalError):
    """The database was written by an incompatible tracecal version, or a frame does not
    conform to the table it is loaded into."""


class SampleError(TracecalError):
    """Microbenchmark samples are missing, malformed, or cannot be imported."""


class CalibrationError(TracecalError):
    """A regressor cannot be fitted or loaded: too few samples, no models for a cluster,
    an artifact written by incompatible library versions."""


class PredictionError(TracecalError):
    """A replay cannot run: the dependency graph is inconsistent or required inputs are absent."""


class WorkloadError(TracecalError):
    """The reference training workload was configured inconsistently (e.g. layers not divisible
    by the pipeline size) or one of its ranks failed."""


class WorkerError(TracecalError):
    """A parser worker process died while reading a file (killed for lack of memory, crashed);
    the message names the file and suggests fewer --workers."""

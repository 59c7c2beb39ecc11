"""tracecal: profiler-trace ingestion, calibration and replay prediction for distributed LLM training."""

__version__ = "0.1.0"

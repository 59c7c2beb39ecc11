"""Kineto (torch.profiler / PyTorch Kineto) JSON traces: ``parser`` reads a document, ``events`` its events."""

from tracecal.sources.registry import Source

SOURCE = Source(
    name="kineto",
    description="Kineto (torch.profiler) JSON traces, one per rank process",
    suffixes=(".json", ".json.gz"),
    patterns=("*.json", "*.json.gz", "*.pt.trace.json[.gz]"),
    run_name_endings=(".pt.trace",),
    not_rank_files=frozenset({"run.json"}),
    parse="tracecal.sources.kineto.parser:parse_kineto_ranks",
)
"""The Kineto source (``tracecal.sources.registry``); ``run.json`` beside the traces is run metadata."""

"""Sources: the trace formats tracecal reads, one package each (see docs/sources.md).

``kineto`` reads torch.profiler JSON. Each source turns its files into ``ParsedRank`` objects
(``tracecal.ingest.trace``), and everything after that is format-independent.
"""

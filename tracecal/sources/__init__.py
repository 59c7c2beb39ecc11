"""Sources: the input formats tracecal reads, one package each, found through one registry (docs/sources.md).

``kineto`` reads torch.profiler JSON, ``nsys`` Nsight Systems exports, ``gpumodeling25`` the decoded
GPT-NeoX run folders of the published GPUModeling25 decoder. Each declares a ``registry.Source``; a
file source turns each rank file into ``ParsedRank`` objects, a folder source a whole run folder into a
``FolderRun`` (``tracecal.ingest.trace``), and everything after that is format-independent.
"""

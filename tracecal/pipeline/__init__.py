"""The pipeline: ingest runs (discover → parse → decode → store) and decode a stored run.

``tracecal.pipeline.ingest.ingest_runs`` and ``tracecal.pipeline.decode.decode_stored_run`` drive
``tracecal.ingest`` and ``tracecal.decode`` and store their results with ``tracecal.sql.loaders``.
"""

-- runs: One row per ingested run (a directory of rank traces). Re-ingesting a run replaces its row.
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS runs (
    run_id           VARCHAR,
    name             VARCHAR,
    source_path      VARCHAR,
    format           VARCHAR,
    cluster          VARCHAR,
    model            VARCHAR,
    pp               INTEGER,
    tp               INTEGER,
    dp               INTEGER,
    nodes            INTEGER,
    gpus_per_node    INTEGER,
    world_size       INTEGER,
    ranks_found      INTEGER,
    layout_source    VARCHAR,
    iteration_marker VARCHAR,
    metadata_json    VARCHAR,
    input_bytes      BIGINT,
    ingest_seconds   DOUBLE,
    ingested_at      TIMESTAMP,
    tool_version     VARCHAR,
    events_dir       VARCHAR
);
COMMENT ON TABLE runs IS 'One row per ingested run (a directory of rank traces). Re-ingesting a run replaces its row.';
COMMENT ON COLUMN runs.run_id IS 'run identifier: the directory name unless --run-id was given';
COMMENT ON COLUMN runs.name IS 'human-readable run name (the directory name)';
COMMENT ON COLUMN runs.source_path IS 'absolute path of the run directory at ingest time';
COMMENT ON COLUMN runs.format IS 'trace format: kineto or nsys';
COMMENT ON COLUMN runs.cluster IS 'cluster the run was taken on (--cluster), used to pick calibrated models';
COMMENT ON COLUMN runs.model IS 'model name from the run name or run.json (e.g. GPT_20B)';
COMMENT ON COLUMN runs.pp IS 'pipeline-parallel size; NULL when unknown';
COMMENT ON COLUMN runs.tp IS 'tensor-parallel size; NULL when unknown';
COMMENT ON COLUMN runs.dp IS 'data-parallel size; NULL when unknown';
COMMENT ON COLUMN runs.nodes IS 'nodes of the job; NULL when unknown';
COMMENT ON COLUMN runs.gpus_per_node IS 'GPUs (ranks) per node; NULL when unknown';
COMMENT ON COLUMN runs.world_size IS 'ranks in the job (distributedInfo.world_size, else rank files found)';
COMMENT ON COLUMN runs.ranks_found IS 'rank traces present in the run directory';
COMMENT ON COLUMN runs.layout_source IS 'where pp/tp/dp came from: flags, run_name, log, run_json, pg_config';
COMMENT ON COLUMN runs.iteration_marker IS 'regex that delimited iterations (default ProfilerStep#N)';
COMMENT ON COLUMN runs.metadata_json IS 'run.json or other run metadata as JSON text; NULL when absent';
COMMENT ON COLUMN runs.input_bytes IS 'bytes of trace files read (compressed size on disk)';
COMMENT ON COLUMN runs.ingest_seconds IS 'wall time of the ingest of this run';
COMMENT ON COLUMN runs.ingested_at IS 'when the run was ingested (UTC)';
COMMENT ON COLUMN runs.tool_version IS 'tracecal version that wrote the run';
COMMENT ON COLUMN runs.events_dir IS 'folder of the run''s event files (one Parquet file per rank), relative to the database''s folder';

-- ranks: One row per rank trace of a run.
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS ranks (
    run_id            VARCHAR,
    rank              INTEGER,
    file              VARCHAR,
    file_bytes        BIGINT,
    host              VARCHAR,
    pid               BIGINT,
    device_name       VARCHAR,
    backend           VARCHAR,
    schema_era        VARCHAR,
    rank_source       VARCHAR,
    events            BIGINT,
    kernels           BIGINT,
    clock_offset_ns   BIGINT,
    clock_residual_ns BIGINT
);
COMMENT ON TABLE ranks IS 'One row per rank trace of a run.';
COMMENT ON COLUMN ranks.run_id IS 'run identifier';
COMMENT ON COLUMN ranks.rank IS 'global rank';
COMMENT ON COLUMN ranks.file IS 'trace file path';
COMMENT ON COLUMN ranks.file_bytes IS 'size of the file on disk';
COMMENT ON COLUMN ranks.host IS 'host name when the trace records it';
COMMENT ON COLUMN ranks.pid IS 'main process id of the rank';
COMMENT ON COLUMN ranks.device_name IS 'GPU name from deviceProperties / TARGET_INFO_GPU; NULL on CPU runs';
COMMENT ON COLUMN ranks.backend IS 'distributed backend (nccl, gloo) from distributedInfo';
COMMENT ON COLUMN ranks.schema_era IS 'Kineto category era: 2021, 2022, 2024 (or nsys)';
COMMENT ON COLUMN ranks.rank_source IS 'where the rank came from: distributedInfo, path, nsys_order, ...';
COMMENT ON COLUMN ranks.events IS 'complete events stored for this rank';
COMMENT ON COLUMN ranks.kernels IS 'GPU kernels among them';
COMMENT ON COLUMN ranks.clock_offset_ns IS 'offset added to this rank''s timestamps to align clocks (docs/decode.md#clock-alignment)';
COMMENT ON COLUMN ranks.clock_residual_ns IS 'median absolute residual of matched collective ends after alignment';

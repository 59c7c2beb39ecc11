-- iterations: One row per iteration per rank (ProfilerStep#N or --iteration-marker).
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS iterations (
    run_id           VARCHAR,
    rank             INTEGER,
    iteration        INTEGER,
    marker           VARCHAR,
    cpu_start_ns     BIGINT,
    cpu_end_ns       BIGINT,
    gpu_start_ns     BIGINT,
    gpu_end_ns       BIGINT,
    aligned_start_ns BIGINT,
    aligned_end_ns   BIGINT,
    dur_ns           BIGINT
);
COMMENT ON TABLE iterations IS 'One row per iteration per rank (ProfilerStep#N or --iteration-marker).';
COMMENT ON COLUMN iterations.run_id IS 'run identifier';
COMMENT ON COLUMN iterations.rank IS 'global rank';
COMMENT ON COLUMN iterations.iteration IS 'iteration index (N of ProfilerStep#N, else the marker''s order)';
COMMENT ON COLUMN iterations.marker IS 'name of the marker event, or NULL when the capture is one iteration';
COMMENT ON COLUMN iterations.cpu_start_ns IS 'start of the marker on the CPU';
COMMENT ON COLUMN iterations.cpu_end_ns IS 'end of the marker on the CPU';
COMMENT ON COLUMN iterations.gpu_start_ns IS 'first GPU activity launched from this iteration; NULL without GPU work';
COMMENT ON COLUMN iterations.gpu_end_ns IS 'end of the last GPU activity launched from this iteration';
COMMENT ON COLUMN iterations.aligned_start_ns IS 'span start after clock alignment';
COMMENT ON COLUMN iterations.aligned_end_ns IS 'span end after clock alignment';
COMMENT ON COLUMN iterations.dur_ns IS 'iteration time: GPU span when there is GPU work, else CPU span';

-- collectives: One row per collective or point-to-point instance per rank, matched across ranks.
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS collectives (
    run_id        VARCHAR,
    rank          INTEGER,
    event_id      BIGINT,
    name          VARCHAR,
    ts_ns         BIGINT,
    dur_ns        BIGINT,
    aligned_ts_ns BIGINT,
    dtype         VARCHAR,
    pg_name       VARCHAR,
    pg_ranks      VARCHAR,
    peer          INTEGER,
    role          VARCHAR,
    seq_in_group  BIGINT,
    match_id      BIGINT,
    iteration     INTEGER,
    stream        INTEGER,
    algbw_gbps    DOUBLE,
    busbw_gbps    DOUBLE,
    size_bytes    BIGINT,
    group_size    INTEGER,
    nodes         INTEGER,
    gpus_per_node INTEGER
);
COMMENT ON TABLE collectives IS 'One row per collective or point-to-point instance per rank, matched across ranks.';
COMMENT ON COLUMN collectives.run_id IS 'run identifier';
COMMENT ON COLUMN collectives.rank IS 'global rank';
COMMENT ON COLUMN collectives.event_id IS 'events.event_id of the NCCL kernel (or gloo CPU op) of the instance';
COMMENT ON COLUMN collectives.name IS 'normalised collective: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, send, recv, barrier, other';
COMMENT ON COLUMN collectives.ts_ns IS 'start on the rank''s own clock';
COMMENT ON COLUMN collectives.dur_ns IS 'duration in ns';
COMMENT ON COLUMN collectives.aligned_ts_ns IS 'start after clock alignment (ts_ns + ranks.clock_offset_ns)';
COMMENT ON COLUMN collectives.dtype IS 'element type';
COMMENT ON COLUMN collectives.pg_name IS 'process group name';
COMMENT ON COLUMN collectives.pg_ranks IS 'global ranks of the process group as JSON text';
COMMENT ON COLUMN collectives.peer IS 'global rank of the peer (send/recv); NULL for collectives';
COMMENT ON COLUMN collectives.role IS 'group role: tp, dp, pp, ep, cp, unknown';
COMMENT ON COLUMN collectives.seq_in_group IS 'order of this instance among the rank''s collectives of the group';
COMMENT ON COLUMN collectives.match_id IS 'shared by the same instance on every member rank; NULL when unmatched';
COMMENT ON COLUMN collectives.iteration IS 'iteration the instance belongs to';
COMMENT ON COLUMN collectives.stream IS 'GPU stream';
COMMENT ON COLUMN collectives.algbw_gbps IS 'algorithm bandwidth size_bytes / dur, GB/s (nccl-tests)';
COMMENT ON COLUMN collectives.busbw_gbps IS 'bus bandwidth algbw × busbw factor, GB/s (nccl-tests)';
COMMENT ON COLUMN collectives.size_bytes IS 'collective payload in bytes (nccl-tests S: the total size for gathers)';
COMMENT ON COLUMN collectives.group_size IS 'ranks in the process group';
COMMENT ON COLUMN collectives.nodes IS 'nodes spanned by the group, when known';
COMMENT ON COLUMN collectives.gpus_per_node IS 'GPUs per node of the group''s ranks, when known';

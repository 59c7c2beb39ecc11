-- events: Every complete (ph=X) event of every rank, normalised across Kineto eras and Nsight exports.
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS events (
    run_id             VARCHAR,
    rank               INTEGER,
    event_id           BIGINT,
    kind               VARCHAR,
    category           VARCHAR,
    name               VARCHAR,
    ts_ns              BIGINT,
    dur_ns             BIGINT,
    pid                BIGINT,
    tid                BIGINT,
    device             INTEGER,
    stream             INTEGER,
    correlation        BIGINT,
    external_id        BIGINT,
    sequence_number    BIGINT,
    fwd_thread_id      BIGINT,
    input_dims         VARCHAR,
    input_types        VARCHAR,
    concrete_inputs    VARCHAR,
    bytes              BIGINT,
    grid               VARCHAR,
    block              VARCHAR,
    coll_name          VARCHAR,
    in_msg_nelems      BIGINT,
    out_msg_nelems     BIGINT,
    group_size         INTEGER,
    coll_dtype         VARCHAR,
    pg_name            VARCHAR,
    pg_desc            VARCHAR,
    pg_ranks           VARCHAR,
    in_split_size      VARCHAR,
    out_split_size     VARCHAR,
    global_rank_start  INTEGER,
    global_rank_stride INTEGER,
    coll_seq           BIGINT,
    src_rank           INTEGER,
    dst_rank           INTEGER
);
COMMENT ON TABLE events IS 'Every complete (ph=X) event of every rank, normalised across Kineto eras and Nsight exports.';
COMMENT ON COLUMN events.run_id IS 'run identifier';
COMMENT ON COLUMN events.rank IS 'global rank';
COMMENT ON COLUMN events.event_id IS 'index of the event within its rank (file order); unique per run and rank';
COMMENT ON COLUMN events.kind IS 'normalised kind: cpu_op, python_function, user_annotation, gpu_user_annotation, cuda_runtime, cuda_driver, kernel, memcpy, memset, nvtx, sync, trace, other';
COMMENT ON COLUMN events.category IS 'raw category as written by the profiler (cat, or the Nsight table)';
COMMENT ON COLUMN events.name IS 'event name (operator, kernel, runtime call, annotation)';
COMMENT ON COLUMN events.ts_ns IS 'start, absolute nanoseconds on the rank''s own clock';
COMMENT ON COLUMN events.dur_ns IS 'duration in nanoseconds; NULL when the trace has none';
COMMENT ON COLUMN events.pid IS 'process id (CPU events) or device id (GPU events); NULL when not numeric';
COMMENT ON COLUMN events.tid IS 'thread id (CPU events) or stream id (GPU events); NULL when not numeric';
COMMENT ON COLUMN events.device IS 'GPU index for GPU activity';
COMMENT ON COLUMN events.stream IS 'GPU stream for GPU activity';
COMMENT ON COLUMN events.correlation IS 'CUPTI correlation id linking a runtime call to the GPU activity it launched';
COMMENT ON COLUMN events.external_id IS 'External id linking a runtime call to the CPU operator that issued it';
COMMENT ON COLUMN events.sequence_number IS 'autograd sequence number (forward op and its backward share it)';
COMMENT ON COLUMN events.fwd_thread_id IS 'for backward ops: the thread that ran the forward op';
COMMENT ON COLUMN events.input_dims IS 'Input Dims as JSON text, e.g. [[8,512],[512,1024]]';
COMMENT ON COLUMN events.input_types IS 'Input type as JSON text, e.g. ["float","float"]';
COMMENT ON COLUMN events.concrete_inputs IS 'Concrete Inputs as JSON text (scalar arguments)';
COMMENT ON COLUMN events.bytes IS 'bytes copied or set (memcpy, memset); message size of an Nsight NCCL NVTX range';
COMMENT ON COLUMN events.grid IS 'kernel grid dims as JSON text';
COMMENT ON COLUMN events.block IS 'kernel block dims as JSON text';
COMMENT ON COLUMN events.coll_name IS 'Collective name arg (allreduce, send, ...) on record_param_comms/NCCL kernels';
COMMENT ON COLUMN events.in_msg_nelems IS 'In msg nelems: elements sent by this rank';
COMMENT ON COLUMN events.out_msg_nelems IS 'Out msg nelems: elements received by this rank';
COMMENT ON COLUMN events.group_size IS 'Group size of the collective''s process group';
COMMENT ON COLUMN events.coll_dtype IS 'dtype arg of the collective (Float, Half, BFloat16, ...)';
COMMENT ON COLUMN events.pg_name IS 'Process Group Name';
COMMENT ON COLUMN events.pg_desc IS 'Process Group Description';
COMMENT ON COLUMN events.pg_ranks IS 'Process Group Ranks as JSON text, e.g. [0,1]';
COMMENT ON COLUMN events.in_split_size IS 'In split size as JSON text (all_to_all)';
COMMENT ON COLUMN events.out_split_size IS 'Out split size as JSON text (all_to_all)';
COMMENT ON COLUMN events.global_rank_start IS 'Global rank start of the group';
COMMENT ON COLUMN events.global_rank_stride IS 'Global rank stride of the group';
COMMENT ON COLUMN events.coll_seq IS 'per-collective sequence number / comms id when the trace records it';
COMMENT ON COLUMN events.src_rank IS 'Src Rank arg of a point-to-point collective (the peer of a recv)';
COMMENT ON COLUMN events.dst_rank IS 'Dst Rank arg of a point-to-point collective (the peer of a send)';

-- samples: Microbenchmark samples of compute operators and collectives, measured or imported, per cluster.
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS samples (
    sample_id     VARCHAR,
    cluster       VARCHAR,
    device_name   VARCHAR,
    host          VARCHAR,
    family        VARCHAR,
    op            VARCHAR,
    direction     VARCHAR,
    tp            INTEGER,
    batch         BIGINT,
    m             BIGINT,
    n             BIGINT,
    k             BIGINT,
    heads         BIGINT,
    seq_q         BIGINT,
    seq_k         BIGINT,
    head_dim      BIGINT,
    causal        BOOLEAN,
    elements      BIGINT,
    tokens        BIGINT,
    vocab         BIGINT,
    hidden        BIGINT,
    params        BIGINT,
    dtype         VARCHAR,
    flops         DOUBLE,
    io_bytes      DOUBLE,
    collective    VARCHAR,
    size_bytes    BIGINT,
    group_size    INTEGER,
    nodes         INTEGER,
    gpus_per_node INTEGER,
    pooled        BOOLEAN,
    median_ns     DOUBLE,
    min_ns        DOUBLE,
    iqr_ns        DOUBLE,
    repeats       INTEGER,
    quality_flag  VARCHAR,
    source        VARCHAR,
    source_file   VARCHAR,
    params_json   VARCHAR,
    torch_version VARCHAR,
    cuda_version  VARCHAR,
    nccl_version  VARCHAR,
    sampled_at    TIMESTAMP,
    timing        VARCHAR
);
COMMENT ON TABLE samples IS 'Microbenchmark samples of compute operators and collectives, measured or imported, per cluster.';
COMMENT ON COLUMN samples.sample_id IS 'stable id: hash of cluster, source, op, direction and features';
COMMENT ON COLUMN samples.cluster IS 'cluster name (perlmutter, vista, local, ...)';
COMMENT ON COLUMN samples.device_name IS 'GPU or CPU name';
COMMENT ON COLUMN samples.host IS 'host that took the sample';
COMMENT ON COLUMN samples.family IS 'op family (docs/decode.md#families) or comm';
COMMENT ON COLUMN samples.op IS 'source op: published name (linear1, allreduce) or sampled op (aten::mm, all_reduce)';
COMMENT ON COLUMN samples.direction IS 'fwd or bwd (comm: fwd)';
COMMENT ON COLUMN samples.tp IS 'tensor-parallel size the shape was derived for (published samples), else NULL';
COMMENT ON COLUMN samples.batch IS 'GEMM batch count (bmm/baddbmm), micro-batch size, optimizer: tensors updated';
COMMENT ON COLUMN samples.m IS 'GEMM rows of the output (M)';
COMMENT ON COLUMN samples.n IS 'GEMM columns of the output (N)';
COMMENT ON COLUMN samples.k IS 'GEMM reduction dimension (K)';
COMMENT ON COLUMN samples.heads IS 'attention heads processed by this operator (per tensor-parallel rank)';
COMMENT ON COLUMN samples.seq_q IS 'attention query sequence length';
COMMENT ON COLUMN samples.seq_k IS 'attention key/value sequence length';
COMMENT ON COLUMN samples.head_dim IS 'attention head dimension';
COMMENT ON COLUMN samples.causal IS 'attention is causal (masked upper triangle)';
COMMENT ON COLUMN samples.elements IS 'elements of the main input tensor (elementwise, norm, softmax, loss)';
COMMENT ON COLUMN samples.tokens IS 'tokens looked up (embedding) or rows of the loss, softmax or norm input';
COMMENT ON COLUMN samples.vocab IS 'vocabulary rows (embedding, loss), per tensor-parallel rank';
COMMENT ON COLUMN samples.hidden IS 'embedding/norm width, softmax row length, optimizer: commonest 1-D param length';
COMMENT ON COLUMN samples.params IS 'parameters updated (optimizer step)';
COMMENT ON COLUMN samples.dtype IS 'element type of the main input: float32, float16, bfloat16, ...';
COMMENT ON COLUMN samples.flops IS 'floating-point operations derived from the shape (2·M·N·K·batch for GEMM)';
COMMENT ON COLUMN samples.io_bytes IS 'bytes read plus written, derived from the shape and dtype';
COMMENT ON COLUMN samples.collective IS 'collective name for comm samples';
COMMENT ON COLUMN samples.size_bytes IS 'collective payload in bytes (nccl-tests S: the total size for gathers)';
COMMENT ON COLUMN samples.group_size IS 'ranks in the process group';
COMMENT ON COLUMN samples.nodes IS 'nodes spanned by the group, when known';
COMMENT ON COLUMN samples.gpus_per_node IS 'GPUs per node of the group''s ranks, when known';
COMMENT ON COLUMN samples.pooled IS 'comm sample from a file pooling several topologies (gpumodeling25 NCCL files without the _N_G suffix; the same rows also come from the per-topology files); false for per-topology files, NULL for compute and measured samples';
COMMENT ON COLUMN samples.median_ns IS 'median duration over repeats, ns';
COMMENT ON COLUMN samples.min_ns IS 'minimum duration, ns';
COMMENT ON COLUMN samples.iqr_ns IS 'inter-quartile range of durations, ns; NULL when one repeat';
COMMENT ON COLUMN samples.repeats IS 'timed repeats (n)';
COMMENT ON COLUMN samples.quality_flag IS 'NULL when plausible, else the reason the sample is excluded';
COMMENT ON COLUMN samples.source IS 'sampler or imported:<format>';
COMMENT ON COLUMN samples.source_file IS 'file the sample came from (imported) or config (sampled)';
COMMENT ON COLUMN samples.params_json IS 'the op''s raw parameters as JSON text (e.g. the published CSV row)';
COMMENT ON COLUMN samples.torch_version IS 'torch version of the sampler';
COMMENT ON COLUMN samples.cuda_version IS 'CUDA version; NULL on CPU';
COMMENT ON COLUMN samples.nccl_version IS 'NCCL version; NULL on CPU / gloo';
COMMENT ON COLUMN samples.sampled_at IS 'when the sample was taken or imported (UTC)';
COMMENT ON COLUMN samples.timing IS 'how a measured sample was timed (docs/samples.md#timing): perf_counter, profiler, cuda_burst, cuda_events; NULL for imported published samples';

-- operators: One row per GPU activity (kernel, memcpy, memset) in GPU traces, or per leaf CPU operator in CPU-only traces, linked to the runtime call and CPU operator that issued it and classified.
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS operators (
    run_id           VARCHAR,
    rank             INTEGER,
    event_id         BIGINT,
    kind             VARCHAR,
    name             VARCHAR,
    ts_ns            BIGINT,
    dur_ns           BIGINT,
    device           INTEGER,
    stream           INTEGER,
    correlation      BIGINT,
    runtime_event_id BIGINT,
    runtime_name     VARCHAR,
    runtime_ts_ns    BIGINT,
    runtime_dur_ns   BIGINT,
    cpu_tid          BIGINT,
    cpu_op_event_id  BIGINT,
    cpu_op_name      VARCHAR,
    cpu_op_ts_ns     BIGINT,
    cpu_op_dur_ns    BIGINT,
    scope_name       VARCHAR,
    input_dims       VARCHAR,
    input_types      VARCHAR,
    sequence_number  BIGINT,
    family           VARCHAR,
    phase            VARCHAR,
    component        VARCHAR,
    iteration        INTEGER,
    link             VARCHAR,
    batch            BIGINT,
    m                BIGINT,
    n                BIGINT,
    k                BIGINT,
    heads            BIGINT,
    seq_q            BIGINT,
    seq_k            BIGINT,
    head_dim         BIGINT,
    causal           BOOLEAN,
    elements         BIGINT,
    tokens           BIGINT,
    vocab            BIGINT,
    hidden           BIGINT,
    params           BIGINT,
    dtype            VARCHAR,
    flops            DOUBLE,
    io_bytes         DOUBLE
);
COMMENT ON TABLE operators IS 'One row per GPU activity (kernel, memcpy, memset) in GPU traces, or per leaf CPU operator in CPU-only traces, linked to the runtime call and CPU operator that issued it and classified.';
COMMENT ON COLUMN operators.run_id IS 'run identifier';
COMMENT ON COLUMN operators.rank IS 'global rank';
COMMENT ON COLUMN operators.event_id IS 'events.event_id of the activity itself';
COMMENT ON COLUMN operators.kind IS 'kernel, memcpy, memset, or cpu_op / user_annotation (CPU-only traces: leaf CPU operators and gloo:* work ranges)';
COMMENT ON COLUMN operators.name IS 'kernel / activity / operator name';
COMMENT ON COLUMN operators.ts_ns IS 'start, absolute ns on the rank''s own clock';
COMMENT ON COLUMN operators.dur_ns IS 'duration in ns';
COMMENT ON COLUMN operators.device IS 'GPU index';
COMMENT ON COLUMN operators.stream IS 'GPU stream';
COMMENT ON COLUMN operators.correlation IS 'correlation id shared with the launching runtime call';
COMMENT ON COLUMN operators.runtime_event_id IS 'events.event_id of the launching runtime call; NULL when unlinked';
COMMENT ON COLUMN operators.runtime_name IS 'launching runtime call (cudaLaunchKernel, ...)';
COMMENT ON COLUMN operators.runtime_ts_ns IS 'start of the launching runtime call';
COMMENT ON COLUMN operators.runtime_dur_ns IS 'duration of the launching runtime call';
COMMENT ON COLUMN operators.cpu_tid IS 'CPU thread of the runtime call / operator';
COMMENT ON COLUMN operators.cpu_op_event_id IS 'events.event_id of the innermost CPU operator; NULL when unlinked';
COMMENT ON COLUMN operators.cpu_op_name IS 'innermost CPU operator (aten::mm, ...)';
COMMENT ON COLUMN operators.cpu_op_ts_ns IS 'start of the CPU operator';
COMMENT ON COLUMN operators.cpu_op_dur_ns IS 'duration of the CPU operator';
COMMENT ON COLUMN operators.scope_name IS 'outermost framework scope enclosing the CPU operator (user annotation)';
COMMENT ON COLUMN operators.input_dims IS 'Input Dims of the CPU operator as JSON text';
COMMENT ON COLUMN operators.input_types IS 'Input type of the CPU operator as JSON text';
COMMENT ON COLUMN operators.sequence_number IS 'autograd sequence number of the CPU operator';
COMMENT ON COLUMN operators.family IS 'op family (docs/decode.md#families): gemm, attention, softmax, norm, elementwise, embedding, loss, optimizer, memcpy, memset, comm, other';
COMMENT ON COLUMN operators.phase IS 'fwd, bwd, optimizer, other (docs/decode.md#phases)';
COMMENT ON COLUMN operators.component IS 'compute_fwd, compute_bwd, optimizer, comm_tp, comm_dp, comm_pp, comm_ep, comm_other, memcpy, other (docs/decode.md#components)';
COMMENT ON COLUMN operators.iteration IS 'iteration whose CPU window launched this activity; NULL when outside all';
COMMENT ON COLUMN operators.link IS 'how the CPU operator was found: external_id (runtime call''s External id), time (innermost cpu_op enclosing the runtime call on its thread), self (CPU-only traces), none';
COMMENT ON COLUMN operators.batch IS 'GEMM batch count (bmm/baddbmm), micro-batch size, optimizer: tensors updated';
COMMENT ON COLUMN operators.m IS 'GEMM rows of the output (M)';
COMMENT ON COLUMN operators.n IS 'GEMM columns of the output (N)';
COMMENT ON COLUMN operators.k IS 'GEMM reduction dimension (K)';
COMMENT ON COLUMN operators.heads IS 'attention heads processed by this operator (per tensor-parallel rank)';
COMMENT ON COLUMN operators.seq_q IS 'attention query sequence length';
COMMENT ON COLUMN operators.seq_k IS 'attention key/value sequence length';
COMMENT ON COLUMN operators.head_dim IS 'attention head dimension';
COMMENT ON COLUMN operators.causal IS 'attention is causal (masked upper triangle)';
COMMENT ON COLUMN operators.elements IS 'elements of the main input tensor (elementwise, norm, softmax, loss)';
COMMENT ON COLUMN operators.tokens IS 'tokens looked up (embedding) or rows of the loss, softmax or norm input';
COMMENT ON COLUMN operators.vocab IS 'vocabulary rows (embedding, loss), per tensor-parallel rank';
COMMENT ON COLUMN operators.hidden IS 'embedding/norm width, softmax row length, optimizer: commonest 1-D param length';
COMMENT ON COLUMN operators.params IS 'parameters updated (optimizer step)';
COMMENT ON COLUMN operators.dtype IS 'element type of the main input: float32, float16, bfloat16, ...';
COMMENT ON COLUMN operators.flops IS 'floating-point operations derived from the shape (2·M·N·K·batch for GEMM)';
COMMENT ON COLUMN operators.io_bytes IS 'bytes read plus written, derived from the shape and dtype';

-- calibrate_traced_operators: traced compute operators of every run taken on one cluster, for the
-- in-trace validation of `calibrate --cluster NAME` (tracecal.calibrate.in_trace).
-- Parameter $1: cluster (runs.cluster). Communication kernels are left out: collectives come from the
-- `collectives` table (calibrate_traced_collectives.sql), which carries their sizes and topology.
-- Columns:
--   run_id, rank, event_id   the operator (see `operators`)
--   cpu_op_event_id          the CPU operator that launched it (its kernels are scored as one op)
--   kind, name, cpu_op_name  activity kind, kernel/operator name, innermost CPU operator
--   family, phase            op family and phase (docs/decode.md#families, #phases)
--   dur_ns                   measured duration, ns
--   <shape columns>          schema.SHAPE_COLUMNS of the operator (batch ... io_bytes)
--   optimizer_step_id        the Optimizer.step#<Class>.step annotation around its CPU operator (an
--   optimizer_step           optimizer step is sampled and scored as a whole), and its name
WITH steps AS (
    SELECT e.run_id, e.rank, e.tid, e.event_id, e.name, e.ts_ns AS start_ns, e.ts_ns + e.dur_ns AS end_ns
    FROM events AS e
    JOIN runs AS r USING (run_id)
    WHERE r.cluster = $1 AND e.name LIKE 'Optimizer.step#%'
)
SELECT
    o.run_id, o.rank, o.event_id, o.cpu_op_event_id, o.kind, o.name, o.cpu_op_name, o.family, o.phase, o.dur_ns,
    o.batch, o.m, o.n, o.k, o.heads, o.seq_q, o.seq_k, o.head_dim, o.causal, o.elements, o.tokens,
    o.vocab, o.hidden, o.params, o.dtype, o.flops, o.io_bytes,
    s.event_id AS optimizer_step_id, s.name AS optimizer_step
FROM operators AS o
JOIN runs AS r USING (run_id)
LEFT JOIN steps AS s
    ON s.run_id = o.run_id AND s.rank = o.rank AND s.tid = o.cpu_tid
   AND o.cpu_op_ts_ns BETWEEN s.start_ns AND s.end_ns
WHERE r.cluster = $1
  AND o.family IS DISTINCT FROM 'comm'
  AND o.dur_ns > 0
ORDER BY o.run_id, o.rank, o.event_id

-- run_op_shapes: the distinct operator calls of one run's best iteration, for
-- `tracecal samples measure compute --from-run` (what to sample, and how much GPU time it covers).
-- Parameter $1: run_id. Every GPU activity (kernel, memcpy, memset; in CPU-only traces every leaf CPU
-- operator) of the best iteration except collectives, which `samples measure comm` samples; all of
-- the run's operators when it has no best iteration. One row per distinct call, with how often and
-- how long it ran.
-- Columns:
--   family             op family of the operators (decode's classification, docs/decode.md#families)
--   cpu_op_name        innermost CPU operator (aten::mm, ...); NULL for an activity no CPU operator launched
--   activity           the activity's own name when cpu_op_name is NULL (what a user sees uncovered)
--   input_dims         Input Dims of the CPU operator as JSON text
--   input_types        Input type of the CPU operator as JSON text
--   concrete_inputs    Concrete Inputs of the CPU operator as JSON text (reduced dims, num_weights, ...)
--   phase              fwd, bwd, optimizer or other
--   causal             attention causality as decoded (NULL when unknown or not attention)
--   memcpy             the memcpy's name (Memcpy HtoD (Pinned -> Device), ...) for memcpy rows
--   list_element_bytes element size a TensorList call's kernel moved (OpaqueType<N> in its name)
--   optimizer_step     the Optimizer.step#<Class>.step annotation around the CPU operator of a GPU
--                      activity, if any (CPU-only traces: NULL, their step's operators stand alone)
--   step_rank          the rank of that step (each rank steps its own parameters)
--   operators          operator rows with this call signature
--   total_ns           their summed duration, ns
WITH best AS (
    SELECT iteration FROM best_iteration WHERE run_id = $1
),
steps AS (
    SELECT rank, tid, name, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns
    FROM events
    WHERE run_id = $1 AND name LIKE 'Optimizer.step#%'
)
SELECT
    o.family,
    o.cpu_op_name,
    CASE WHEN o.cpu_op_name IS NULL THEN o.name END AS activity,
    o.input_dims,
    o.input_types,
    e.concrete_inputs,
    o.phase,
    o.causal,
    CASE WHEN o.kind = 'memcpy' THEN o.name END AS memcpy,
    CASE
        WHEN o.input_types LIKE '%TensorList%'
        THEN TRY_CAST(NULLIF(regexp_extract(o.name, 'OpaqueType<(\d+)', 1), '') AS INTEGER)
    END AS list_element_bytes,
    s.name AS optimizer_step,
    CASE WHEN s.name IS NOT NULL THEN o.rank END AS step_rank,
    count(*) AS operators,
    sum(o.dur_ns) AS total_ns
FROM operators AS o
LEFT JOIN events AS e
    ON e.run_id = o.run_id AND e.rank = o.rank AND e.event_id = o.cpu_op_event_id
LEFT JOIN steps AS s
    ON s.rank = o.rank AND s.tid = o.cpu_tid AND o.cpu_op_ts_ns BETWEEN s.start_ns AND s.end_ns
    -- a step is sampled whole on GPU work only (vocabulary.GPU_ACTIVITY_KINDS, calibrate.in_trace
    -- STEP_KINDS): on a CPU-only trace its leaf operators are sampled and replayed one by one
    AND o.kind IN ('kernel', 'memcpy', 'memset')
WHERE o.run_id = $1
  AND o.family IS DISTINCT FROM 'comm'
  AND (o.iteration = (SELECT iteration FROM best) OR NOT EXISTS (SELECT 1 FROM best))
GROUP BY ALL
ORDER BY total_ns DESC NULLS LAST, o.cpu_op_name, o.input_dims, o.phase

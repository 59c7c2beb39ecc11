-- predict_optimizer_steps: the operators of one iteration that ran inside an optimizer step, with the
-- step around them, so that the predicted replay scores a step whole, as the in-trace check does
-- (tracecal.calibrate.in_trace.as_optimizer_steps; calibrate_traced_operators.sql finds steps alike).
-- Parameters: run_id, iteration.
-- Columns:
--   rank, event_id        the operator (see `operators`)
--   optimizer_step_id     the `Optimizer.step#<Class>.step` annotation around its CPU operator (same
--   optimizer_step        thread, CPU operator start inside the annotation), and its name
WITH steps AS (
    SELECT e.rank, e.tid, e.event_id, e.name, e.ts_ns AS start_ns, e.ts_ns + e.dur_ns AS end_ns
    FROM events AS e
    WHERE e.run_id = $1 AND e.name LIKE 'Optimizer.step#%'
)
SELECT o.rank, o.event_id, s.event_id AS optimizer_step_id, s.name AS optimizer_step
FROM operators AS o
JOIN steps AS s
    ON s.rank = o.rank AND s.tid = o.cpu_tid AND o.cpu_op_ts_ns BETWEEN s.start_ns AND s.end_ns
WHERE o.run_id = $1 AND o.iteration = $2
ORDER BY o.rank, o.event_id

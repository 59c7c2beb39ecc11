-- predict_activities: the operators of one iteration of a run, all ranks (nodes of the replay graph).
-- Parameters: run_id, iteration. Columns: every `operators` column (see tracecal/schema.py).
SELECT o.*
FROM operators AS o
WHERE o.run_id = ? AND o.iteration = ?
ORDER BY o.rank, o.ts_ns, o.event_id

-- predict_collectives: collective and point-to-point instances of one iteration, all ranks.
-- Parameters: run_id, iteration. Columns: every `collectives` column (see tracecal/schema.py).
SELECT c.*
FROM collectives AS c
WHERE c.run_id = ? AND c.iteration = ?
ORDER BY c.rank, c.ts_ns, c.event_id

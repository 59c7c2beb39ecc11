-- export_events: the stored events of a run, or of one iteration, with what tracecal decoded of them.
-- Parameters: run_id, iteration (NULL: every event of the run).
-- An iteration's events: the operators and collectives of that iteration, GPU activity that is not an
-- operator (gpu_user_annotation, sync) and overlaps the iteration's GPU span, and every other (CPU)
-- event that overlaps the iteration's CPU window (a zero-length one inside it).
-- Columns: every `events` column (see tracecal/schema.py), then
--   family       operators.family; NULL when the event is not an operator
--   phase        operators.phase
--   component    operators.component
--   match_id     collectives.match_id of the instance the event is a member of; NULL otherwise
--   collective   collectives.name (normalised: all_reduce, send, ...) of that instance
WITH win AS (
    SELECT rank, cpu_start_ns, cpu_end_ns,
           coalesce(gpu_start_ns, cpu_start_ns) AS gpu_start_ns,
           coalesce(gpu_end_ns, cpu_end_ns) AS gpu_end_ns
    FROM iterations
    WHERE run_id = $1 AND iteration = $2
)
SELECT e.*, o.family, o.phase, o.component, c.match_id, c.name AS collective
FROM events AS e
LEFT JOIN operators AS o ON o.run_id = e.run_id AND o.rank = e.rank AND o.event_id = e.event_id
LEFT JOIN (
    SELECT rank, event_id, any_value(match_id) AS match_id, any_value(name) AS name, any_value(iteration) AS iteration
    FROM collectives WHERE run_id = $1 GROUP BY rank, event_id
) AS c ON c.rank = e.rank AND c.event_id = e.event_id
LEFT JOIN win AS w ON w.rank = e.rank
WHERE e.run_id = $1
  AND (
    $2 IS NULL
    OR o.iteration = $2
    OR c.iteration = $2
    OR (o.event_id IS NULL AND c.event_id IS NULL AND CASE
          WHEN e.kind IN ('kernel', 'memcpy', 'memset') THEN false
          WHEN e.kind IN ('gpu_user_annotation', 'sync')
            THEN e.ts_ns < w.gpu_end_ns AND e.ts_ns + coalesce(e.dur_ns, 0) > w.gpu_start_ns
          ELSE e.ts_ns < w.cpu_end_ns
               AND (e.ts_ns + coalesce(e.dur_ns, 0) > w.cpu_start_ns OR e.ts_ns >= w.cpu_start_ns)
        END)
  )
ORDER BY e.rank, e.event_id

-- decode_window_sizes: one rank's events per iteration, to group iterations into decode windows.
-- An event counts for the last iteration starting at or before its ts_ns (the first iteration when
-- none does, or when ts_ns is NULL); GPU activity is counted by its own start, not by its launch
-- (close enough to size a window, and no join).
-- Parameters: $run_id, $rank, $starts (the iterations' CPU starts, ascending).
--   position  0-based position in $starts
--   events    events counted for it (positions without events are left out)
WITH starts AS (
    SELECT unnest($starts::BIGINT[]) AS start_ns, generate_subscripts($starts::BIGINT[], 1) - 1 AS position
)
SELECT coalesce(s.position, 0) AS position, count(*) AS events
FROM (SELECT ts_ns FROM events WHERE run_id = $run_id AND rank = $rank) AS e
ASOF LEFT JOIN starts AS s ON e.ts_ns >= s.start_ns
GROUP BY ALL
ORDER BY position

-- decode_window_context: one rank's CPU-side intervals that cross the start of a decode window.
-- Such an interval (an outer scope, a ProfilerStep's parent, a cpu_op whose work a later window
-- launches) encloses work of the windows it reaches into, so decode adds it to them as context.
-- Window w (1-based here) starts at $bounds[w]; window 0 starts before everything. An interval
-- [ts_ns, ts_ns + dur_ns) is context for window w when ts_ns < $bounds[w] < ts_ns + dur_ns.
-- Run once per rank: two as-of joins of the rank's CPU intervals (their times only) to the few window
-- starts, then the columns of the few that cross one.
-- Parameters: $run_id, $rank, $columns (the events columns to return), $gpu_kinds, $bounds
-- (the starts of windows 1.., ascending).
--   $columns       as in events
--   first_window   the first window it is context for (the one after the window of its ts_ns)
--   last_window    the last one (the window holding its end)
WITH bounds AS (
    SELECT unnest($bounds::BIGINT[]) AS start_ns, generate_subscripts($bounds::BIGINT[], 1) AS window
),
intervals AS (
    SELECT event_id AS _event_id, ts_ns AS _ts_ns, ts_ns + dur_ns AS _end_ns
    FROM events
    WHERE run_id = $run_id AND rank = $rank AND dur_ns > 0 AND NOT coalesce(list_contains($gpu_kinds, kind), false)
),
crossing AS (
    SELECT i._event_id, coalesce(a.window, 0) + 1 AS first_window, coalesce(b.window, 0) AS last_window
    FROM intervals AS i
    ASOF LEFT JOIN bounds AS a ON i._ts_ns >= a.start_ns
    ASOF LEFT JOIN bounds AS b ON i._end_ns > b.start_ns
    WHERE coalesce(b.window, 0) >= coalesce(a.window, 0) + 1
)
SELECT COLUMNS($columns), c.first_window, c.last_window
FROM events AS e
JOIN crossing AS c ON e.event_id = c._event_id
WHERE e.run_id = $run_id AND e.rank = $rank

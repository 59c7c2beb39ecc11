-- predict_stream_carry_in: per GPU stream of one iteration, when the stream finished the work it was
-- running before the iteration's first activity on it: the previous iteration's tail, which a first
-- kernel launched early (the CPU runs ahead of the GPU) waits for. The replay starts that stream no
-- earlier (see docs/replay.md, "Boundary").
-- Parameters: run_id, iteration.
--   rank           global rank
--   stream         GPU stream
--   busy_until_ns  latest end of a GPU activity on the stream that started before the iteration's
--                  first activity on it (rank clock)
WITH first AS (
    SELECT rank, stream, min(ts_ns) AS first_ns
    FROM operators
    WHERE run_id = $1 AND iteration = $2 AND kind IN ('kernel', 'memcpy', 'memset') AND stream IS NOT NULL
    GROUP BY rank, stream
)
SELECT f.rank, f.stream, max(e.ts_ns + e.dur_ns) AS busy_until_ns
FROM first AS f
JOIN events AS e
  ON e.run_id = $1 AND e.rank = f.rank AND e.stream = f.stream
 AND e.kind IN ('kernel', 'memcpy', 'memset') AND e.ts_ns < f.first_ns AND e.dur_ns IS NOT NULL
GROUP BY f.rank, f.stream
ORDER BY f.rank, f.stream

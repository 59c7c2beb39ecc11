-- gpu_busy: per rank, how much of the run's best iteration its GPU was busy (docs/workload.md#tracecal-demo).
-- Parameters: run_id.
-- The iteration is the rank's GPU span of the best iteration (iterations.gpu_start_ns .. gpu_end_ns,
-- the iteration time of a GPU trace); busy is the union of its kernels, memcpy and memset clipped to
-- that span (macros/interval_union.sql), whichever CPU window launched them. Ranks without GPU
-- activity (CPU-only traces) have no rows.
--   rank          global rank
--   iteration     the best iteration
--   iteration_ns  the rank's GPU span of it, ns
--   busy_ns       time with at least one GPU activity running, ns
--   busy_share    busy_ns / iteration_ns
WITH span AS (
    SELECT i.rank, i.iteration, i.gpu_start_ns AS ws, i.gpu_end_ns AS we
    FROM iterations AS i
    JOIN best_iteration AS b USING (run_id, iteration)
    WHERE i.run_id = $1 AND i.gpu_start_ns IS NOT NULL AND i.gpu_end_ns > i.gpu_start_ns
),
activities AS (
    SELECT
        o.run_id, o.rank, 1 AS level,
        greatest(o.ts_ns, span.ws) AS s, least(o.ts_ns + o.dur_ns, span.we) AS e
    FROM operators AS o
    JOIN span USING (rank)
    WHERE o.run_id = $1 AND o.kind IN ('kernel', 'memcpy', 'memset') AND o.dur_ns > 0
      AND o.ts_ns < span.we AND o.ts_ns + o.dur_ns > span.ws
)
SELECT
    span.rank,
    span.iteration,
    span.we - span.ws AS iteration_ns,
    coalesce(u.union_ns, 0) AS busy_ns,
    coalesce(u.union_ns, 0) / (span.we - span.ws) AS busy_share
FROM span
LEFT JOIN interval_union('activities') AS u ON u.rank = span.rank
ORDER BY span.rank

-- Per run: min, max, mean, std and (mean-min)/min of iteration times (slowest rank per iteration)
--
-- An iteration's time is its slowest rank's span (docs/decode.md#iterations); the statistics are over the
-- iterations recorded on every rank (over all iterations when none is).
--
-- depends on: iterations, best_iteration
--
-- columns:
--   run_id: run identifier
--   iterations: iterations in the statistics (those recorded on every rank, when any is)
--   min_ns: fastest iteration time, ns (the best iteration)
--   max_ns: slowest iteration time, ns
--   mean_ns: mean iteration time, ns
--   std_ns: sample standard deviation of iteration times, ns; NULL with one iteration
--   mean_vs_min: (mean - min) / min: how far a typical iteration is from the best (0.1 = 10 %)
--   best_iteration: index of the best iteration (see best_iteration)

WITH per_iteration AS (
    SELECT run_id, iteration, max(dur_ns) AS dur_ns, count(DISTINCT rank) AS ranks
    FROM iterations
    GROUP BY run_id, iteration
),
run_ranks AS (
    SELECT run_id, count(DISTINCT rank) AS n FROM iterations GROUP BY run_id
),
pool AS (
    SELECT p.*
    FROM per_iteration AS p
    JOIN run_ranks AS r USING (run_id)
    WHERE p.ranks = r.n OR NOT EXISTS (
        SELECT 1 FROM per_iteration AS q WHERE q.run_id = p.run_id AND q.ranks = r.n
    )
)
SELECT
    pool.run_id,
    count(*) AS iterations,
    min(pool.dur_ns) AS min_ns,
    max(pool.dur_ns) AS max_ns,
    avg(pool.dur_ns) AS mean_ns,
    stddev_samp(pool.dur_ns) AS std_ns,
    (avg(pool.dur_ns) - min(pool.dur_ns)) / nullif(min(pool.dur_ns), 0) AS mean_vs_min,
    any_value(b.iteration) AS best_iteration
FROM pool
LEFT JOIN best_iteration AS b USING (run_id)
GROUP BY pool.run_id;

-- diff_operator_time: operator time of a run's best iteration per rank and group, for `tracecal diff`.
-- Parameters: run_id.
--   rank          global rank
--   family        operators.family (NULL -> 'other')
--   name          the operator's own name (kernel, or CPU operator in CPU-only traces)
--   component     operators.component (NULL -> 'other')
--   count         operators of the group on the rank
--   time_ns       their summed duration, ns (overlapping operators each count in full)
WITH best AS (
    SELECT iteration FROM best_iteration WHERE run_id = $1
)
SELECT o.rank,
       coalesce(o.family, 'other') AS family,
       o.name,
       coalesce(o.component, 'other') AS component,
       count(*) AS count,
       sum(o.dur_ns) AS time_ns
FROM operators AS o
JOIN best AS b ON o.iteration = b.iteration
WHERE o.run_id = $1 AND o.dur_ns IS NOT NULL
GROUP BY o.rank, coalesce(o.family, 'other'), o.name, coalesce(o.component, 'other')
ORDER BY o.rank, family, o.name

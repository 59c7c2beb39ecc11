-- iterations_per_iteration: what `tracecal iterations RUN` lists, one row per iteration of a run ($1).
--   iteration        iteration index (ProfilerStep#N, marker order, or 0 when the capture is one iteration)
--   marker           marker name on the lowest rank (NULL: no markers, the capture is one iteration)
--   ranks            ranks that recorded the iteration
--   slowest_ms       iteration time: the slowest rank's span (GPU span, else CPU window), ms
--   fastest_ms       the fastest rank's span, ms
--   slowest_rank     rank with the longest span
--   aligned_span_ms  latest aligned end - earliest aligned start over ranks (clock-aligned), ms
--   best             true for the run's best iteration
SELECT
    i.iteration,
    arg_min(i.marker, i.rank) AS marker,
    count(DISTINCT i.rank) AS ranks,
    round(max(i.dur_ns) / 1e6, 3) AS slowest_ms,
    round(min(i.dur_ns) / 1e6, 3) AS fastest_ms,
    arg_max(i.rank, i.dur_ns) AS slowest_rank,
    round((max(i.aligned_end_ns) - min(i.aligned_start_ns)) / 1e6, 3) AS aligned_span_ms,
    coalesce(any_value(b.iteration) = i.iteration, false) AS best
FROM iterations AS i
LEFT JOIN best_iteration AS b ON b.run_id = i.run_id
WHERE i.run_id = $1
GROUP BY i.iteration
ORDER BY i.iteration;

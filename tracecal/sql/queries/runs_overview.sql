-- runs_overview: what `tracecal runs` prints, one row per ingested run.
--   run_id       run identifier
--   format       kineto or nsys
--   cluster      cluster name given at ingest (NULL when not given)
--   layout       pp x tp x dp when known
--   ranks        rank traces stored
--   world_size   ranks in the job
--   events       complete events stored over all ranks
--   span_ms      capture span over all ranks (first event start to last event end), ms
--   ingested_at  when the run was ingested (to the second)
--   source_path  run directory at ingest time
SELECT
    r.run_id,
    r.format,
    r.cluster,
    CASE WHEN r.pp IS NOT NULL THEN concat_ws('x', r.pp, r.tp, r.dp) END AS layout,
    r.ranks_found AS ranks,
    r.world_size,
    (SELECT sum(k.events) FROM ranks k WHERE k.run_id = r.run_id) AS events,
    round((SELECT (max(e.ts_ns + coalesce(e.dur_ns, 0)) - min(e.ts_ns)) / 1e6
           FROM events e WHERE e.run_id = r.run_id), 3) AS span_ms,
    date_trunc('second', r.ingested_at) AS ingested_at,
    r.source_path
FROM runs r
ORDER BY r.run_id;

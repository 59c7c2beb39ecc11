-- calibrate_traced_collectives: traced collective and point-to-point instances of every run taken on
-- one cluster, shaped like the comm rows `CalibratedModels.predict` takes.
-- Parameter $1: cluster (runs.cluster).
-- Columns:
--   run_id, rank, event_id   the instance (see `collectives`)
--   name                     normalised collective name (also returned as `collective`)
--   family                   always 'comm'
--   phase                    NULL (collectives are predicted with the fwd/only direction)
--   dur_ns                   measured duration, ns
--   size_bytes, group_size, nodes, gpus_per_node, dtype   schema.COMM_COLUMNS and the element type
SELECT
    c.run_id, c.rank, c.event_id, c.name, c.name AS collective, 'comm' AS family,
    CAST(NULL AS VARCHAR) AS phase, c.dur_ns, c.size_bytes, c.group_size, c.nodes, c.gpus_per_node,
    c.dtype
FROM collectives AS c
JOIN runs AS r USING (run_id)
WHERE r.cluster = $1
  AND c.dur_ns > 0
ORDER BY c.run_id, c.rank, c.event_id

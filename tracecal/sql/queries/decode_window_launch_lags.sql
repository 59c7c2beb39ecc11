-- decode_window_launch_lags: how far one rank's GPU activity starts after its launch, so that a
-- window's GPU rows can be read by a range on their own start (decode_window_events.sql).
-- The launch is the start of the activity's runtime call: the cuda_runtime/cuda_driver event with
-- the same correlation, the first by event_id (the one decode links). One join of the whole rank,
-- run once per rank.
-- Parameters: $run_id, $rank, $gpu_kinds, $runtime_kinds (tracecal.decode.link).
--   gpu_events  the rank's GPU activities (0: a CPU-only rank)
--   min_lag_ns  least ts_ns - launch over activities with a launch (NULL: none has one)
--   max_lag_ns  greatest ts_ns - launch
WITH runtime AS (
    SELECT correlation, arg_min_null(ts_ns, event_id) AS launch_ns
    FROM events
    WHERE run_id = $run_id AND rank = $rank AND list_contains($runtime_kinds, kind) AND correlation IS NOT NULL
    GROUP BY correlation
)
SELECT count(*) AS gpu_events, min(g.ts_ns - r.launch_ns) AS min_lag_ns, max(g.ts_ns - r.launch_ns) AS max_lag_ns
FROM events AS g
LEFT JOIN runtime AS r ON g.correlation = r.correlation
WHERE g.run_id = $run_id AND g.rank = $rank AND list_contains($gpu_kinds, g.kind)

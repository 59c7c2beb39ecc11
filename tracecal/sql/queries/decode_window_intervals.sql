-- decode_window_intervals: one rank's CPU-side intervals, their times only, to find those that cross
-- the start of a decode window (tracecal.decode.windows.crossing_windows). Such an interval (an outer
-- scope, a ProfilerStep's parent, a cpu_op whose work a later window launches) encloses work of the
-- windows it reaches into, so decode adds it to them as context; its columns are then read by
-- decode_window_rows.sql. Run once per rank and read in batches: three columns of the rank are
-- scanned once, and no join or sort of the whole rank is made.
-- Parameters: $run_id, $rank, $gpu_kinds (tracecal.decode.link).
--   event_id, ts_ns  as in events
--   end_ns           ts_ns + dur_ns (dur_ns > 0)
SELECT event_id, ts_ns, ts_ns + dur_ns AS end_ns
FROM events
WHERE run_id = $run_id AND rank = $rank AND dur_ns > 0 AND ts_ns IS NOT NULL
  AND NOT coalesce(list_contains($gpu_kinds, kind), false)

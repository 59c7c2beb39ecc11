-- decode_window_markers: one rank's iteration-marker candidates, the rows decode's
-- iteration_windows reads (tracecal.decode.iterations).
-- Parameters: $run_id, $rank, $kinds (the marker kinds), $names (the names matching the marker).
--   rank, event_id, kind, name, ts_ns  as in events
--   end_ns                             ts_ns + dur_ns (a NULL duration is an instant)
SELECT rank, event_id, kind, name, ts_ns, ts_ns + coalesce(dur_ns, 0) AS end_ns
FROM events
WHERE run_id = $run_id AND rank = $rank AND list_contains($kinds, kind) AND list_contains($names, name)

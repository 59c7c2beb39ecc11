-- decode_window_marker_names: the distinct names of one rank's events of the iteration-marker kinds.
-- Decode matches the marker regex on these names itself (the regex then means what it means in
-- decode), then reads the candidates with decode_window_markers.sql.
-- Parameters: $run_id, $rank, $kinds (the marker kinds: tracecal.decode.iterations).
--   name  one distinct name (never NULL)
SELECT DISTINCT name
FROM events
WHERE run_id = $run_id AND rank = $rank AND list_contains($kinds, kind) AND name IS NOT NULL

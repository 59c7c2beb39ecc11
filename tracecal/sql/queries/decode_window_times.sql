-- decode_window_times: the start of every event of one rank, to count its events per iteration and
-- group iterations into decode windows (tracecal.decode.windows.events_per_iteration). Read in
-- batches: one column of the rank is scanned once, and no join or sort of the whole rank is made.
-- GPU activity is counted by its own start, not by its launch (close enough to size a window).
-- Parameters: $run_id, $rank.
--   ts_ns  as in events (NULL: counted for the first iteration)
SELECT ts_ns
FROM events
WHERE run_id = $run_id AND rank = $rank

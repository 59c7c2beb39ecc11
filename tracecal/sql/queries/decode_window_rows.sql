-- decode_window_rows: some of one rank's events by event id, the columns decode reads (the few
-- intervals that cross a window start: decode_window_intervals.sql). The ids are a semi-join, so the
-- other columns are read only for the rows that match.
-- Parameters: $run_id, $rank, $columns (the events columns to return), $event_ids.
--   $columns  as in events, unsorted
SELECT COLUMNS($columns)
FROM events
WHERE run_id = $run_id AND rank = $rank AND event_id IN (SELECT unnest($event_ids::BIGINT[]))

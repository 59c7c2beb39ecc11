-- decode_window_events: the events of one decode window of a rank (docs/decode.md#windows).
-- A window is the CPU time [$lo, $hi) ($lo NULL: from the beginning; $hi NULL: to the end). A CPU-side
-- event is in it by its ts_ns, a GPU activity by its launch: the start of its runtime call (the
-- cuda_runtime/cuda_driver event with the same correlation, first by event_id), or its own ts_ns
-- without one. An event with a NULL time is in the first window.
-- GPU rows are read by a range on their own start, [$gpu_lo, $gpu_hi) (the window widened by the
-- launch lags of decode_window_launch_lags.sql), and their runtime calls by the range
-- [$runtime_lo, $runtime_hi) that holds the launch of each of them; the first call by event_id
-- within that range is then the first of the rank, and no join touches the rest of the rank.
-- Every range is written as plain comparisons of ts_ns (no CASE), so that DuckDB pushes it into the
-- scan and skips the row groups of a Parquet shard whose ts_ns statistics lie outside it: a window
-- reads its part of the rank, not the whole rank.
-- Parameters: $run_id, $rank, $columns (the events columns to return), $gpu_kinds, $runtime_kinds,
-- $lo, $hi, $gpu_lo, $gpu_hi, $runtime_lo, $runtime_hi (NULL bounds are open).
--   $columns  as in events, unsorted
WITH runtime AS (
    SELECT correlation AS _correlation, arg_min_null(ts_ns, event_id) AS _launch_ns
    FROM events
    WHERE run_id = $run_id AND rank = $rank AND list_contains($runtime_kinds, kind) AND correlation IS NOT NULL
      AND ($runtime_lo IS NULL OR ts_ns >= $runtime_lo) AND ($runtime_hi IS NULL OR ts_ns < $runtime_hi)
    GROUP BY correlation
),
gpu AS (
    SELECT COLUMNS($columns)
    FROM events
    WHERE run_id = $run_id AND rank = $rank AND list_contains($gpu_kinds, kind)
      AND (ts_ns IS NULL OR (($gpu_lo IS NULL OR ts_ns >= $gpu_lo) AND ($gpu_hi IS NULL OR ts_ns < $gpu_hi)))
),
launched AS (
    SELECT g.*, coalesce(r._launch_ns, g.ts_ns) AS _launch_ns
    FROM gpu AS g
    LEFT JOIN runtime AS r ON g.correlation = r._correlation
)
SELECT COLUMNS($columns)
FROM events
WHERE run_id = $run_id AND rank = $rank AND NOT coalesce(list_contains($gpu_kinds, kind), false)
  AND ((ts_ns IS NULL AND $lo IS NULL) OR (($lo IS NULL OR ts_ns >= $lo) AND ($hi IS NULL OR ts_ns < $hi)))
UNION ALL
SELECT COLUMNS($columns)
FROM launched
WHERE CASE
    WHEN _launch_ns IS NULL THEN $lo IS NULL
    ELSE ($lo IS NULL OR _launch_ns >= $lo) AND ($hi IS NULL OR _launch_ns < $hi)
END

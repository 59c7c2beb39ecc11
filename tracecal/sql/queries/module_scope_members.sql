-- module_scope_members: every GPU activity of an iteration launched inside a module frame.
-- A module occurrence (tracecal.sources.gpumodeling25.validate.modules) is a CPU frame whose name matches a module regex; its
-- members are the operators whose launching runtime call started inside the frame, on the same rank
-- and thread. Parameters: run_id, iteration, the frame-name regex.
--   rank        global rank
--   scope_id    events.event_id of the frame (one module occurrence)
--   scope_name  the frame's name
--   event_id    operators.event_id of a member activity
WITH scopes AS (
    SELECT rank, event_id AS scope_id, name AS scope_name, tid, ts_ns, ts_ns + dur_ns AS end_ns
    FROM events
    WHERE run_id = $1
      AND kind IN ('python_function', 'cpu_op', 'user_annotation')
      AND regexp_matches(name, $3)
),
members AS (
    SELECT rank, event_id, cpu_tid, runtime_ts_ns
    FROM operators
    WHERE run_id = $1 AND iteration = $2 AND runtime_ts_ns IS NOT NULL
)
SELECT s.rank, s.scope_id, s.scope_name, m.event_id
FROM scopes AS s
JOIN members AS m
  ON m.rank = s.rank AND m.cpu_tid = s.tid AND m.runtime_ts_ns >= s.ts_ns AND m.runtime_ts_ns < s.end_ns
ORDER BY s.rank, s.scope_id, m.event_id

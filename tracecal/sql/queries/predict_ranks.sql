-- predict_ranks: per rank, what the replay needs to know about one iteration.
-- Parameters: run_id, iteration.
--   rank                    global rank
--   clock_offset_ns         offset aligning the rank's clock (NULL -> 0)
--   window_start_ns         iteration marker start on the CPU (rank clock)
--   window_end_ns           iteration marker end on the CPU
--   measured_iteration_ns   iteration time as decoded (GPU span, else CPU span)
--   main_tid                thread of the iteration marker, else the thread with most operators
WITH it AS (
    SELECT * FROM iterations WHERE run_id = $1 AND iteration = $2
),
marker_thread AS (
    SELECT it.rank, any_value(e.tid) AS tid
    FROM it
    JOIN events AS e
      ON e.run_id = it.run_id AND e.rank = it.rank AND e.ts_ns = it.cpu_start_ns AND e.name = it.marker
    GROUP BY it.rank
),
busiest_thread AS (
    SELECT rank, mode(cpu_tid) AS tid
    FROM operators
    WHERE run_id = $1 AND iteration = $2
    GROUP BY rank
)
SELECT
    it.rank,
    r.clock_offset_ns,
    it.cpu_start_ns AS window_start_ns,
    it.cpu_end_ns AS window_end_ns,
    it.dur_ns AS measured_iteration_ns,
    coalesce(m.tid, b.tid) AS main_tid
FROM it
LEFT JOIN ranks AS r ON r.run_id = it.run_id AND r.rank = it.rank
LEFT JOIN marker_thread AS m ON m.rank = it.rank
LEFT JOIN busiest_thread AS b ON b.rank = it.rank
ORDER BY it.rank

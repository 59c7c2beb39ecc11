-- predict_best_iteration: the iteration a prediction replays by default (view best_iteration).
-- Parameters: run_id.
--   iteration  the best iteration index
--   dur_ns     its slowest rank's time, ns
SELECT iteration, dur_ns FROM best_iteration WHERE run_id = ?

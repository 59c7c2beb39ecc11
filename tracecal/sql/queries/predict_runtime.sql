-- predict_runtime: CPU runtime/driver calls inside each rank's window of one iteration (GPU traces):
-- the launches, synchronizations and stream waits that order GPU work.
-- Parameters: iteration, run_id.
--   rank      global rank
--   event_id  events.event_id of the call
--   name      runtime call (cudaLaunchKernel, cudaStreamSynchronize, ...)
--   ts_ns     start on the rank's clock
--   dur_ns    duration
--   tid       CPU thread of the call
SELECT e.rank, e.event_id, e.name, e.ts_ns, e.dur_ns, e.tid
FROM events AS e
JOIN iterations AS i
  ON i.run_id = e.run_id AND i.rank = e.rank AND i.iteration = ?
WHERE e.run_id = ?
  AND e.kind IN ('cuda_runtime', 'cuda_driver')
  AND e.ts_ns >= i.cpu_start_ns AND e.ts_ns < i.cpu_end_ns
ORDER BY e.rank, e.ts_ns, e.event_id

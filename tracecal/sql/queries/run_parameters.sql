-- run_parameters: the parameters each rank's optimizer steps, as the autograd engine saw them.
-- Parameter $1: run_id. Every `torch::autograd::AccumulateGrad` call of the best iteration (all of
-- the run's when it has no best iteration), in order per rank: one call per parameter and backward
-- pass, recording the parameter's shape and dtype. An iteration of several micro-batches repeats the
-- same sequence once per backward pass (`samplers.from_run.parameter_groups` collapses them).
-- Columns: rank, input_dims (JSON text, [[shape]]), input_types (JSON text, [dtype]).
WITH best AS (
    SELECT iteration FROM best_iteration WHERE run_id = $1
),
windows AS (
    SELECT i.rank, i.cpu_start_ns, i.cpu_end_ns
    FROM iterations AS i
    WHERE i.run_id = $1 AND i.iteration = (SELECT iteration FROM best)
)
SELECT e.rank, e.input_dims, e.input_types
FROM events AS e
WHERE e.run_id = $1
  AND e.name = 'torch::autograd::AccumulateGrad'
  AND (
      NOT EXISTS (SELECT 1 FROM best)
      OR EXISTS (
          SELECT 1 FROM windows AS w
          WHERE w.rank = e.rank AND e.ts_ns BETWEEN w.cpu_start_ns AND w.cpu_end_ns
      )
  )
ORDER BY e.rank, e.ts_ns, e.event_id

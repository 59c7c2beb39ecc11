-- Operators per run by family, phase, CPU operator (kernel name when unlinked) and input shape
--
-- GPU activities are grouped by the CPU operator that launched them; on CPU-only runs the rows are the CPU
-- operators themselves.
--
-- depends on: operators
--
-- columns:
--   run_id: run identifier
--   family: op family (docs/decode.md#families)
--   phase: fwd, bwd, optimizer, other (docs/decode.md#phases)
--   op: innermost CPU operator, or the activity name when unlinked
--   input_dims: Input Dims of the CPU operator as JSON text
--   dtype: element type of the main input
--   count: operator rows (GPU activities, or CPU ops on CPU-only runs) over all ranks and iterations
--   ranks: ranks on which the group occurs
--   total_ns: summed duration, ns
--   mean_ns: mean duration, ns
--   min_ns: shortest duration, ns
--   max_ns: longest duration, ns
--   share: share of the run's summed operator time (0-1)
--   flops: mean floating-point operations per operator from its shape (gemm, attention); NULL otherwise
--   tflops_per_s: achieved TFLOP/s: summed flops over summed duration

SELECT
    run_id,
    family,
    phase,
    coalesce(cpu_op_name, name) AS op,
    input_dims,
    dtype,
    count(*) AS count,
    count(DISTINCT rank) AS ranks,
    sum(dur_ns) AS total_ns,
    avg(dur_ns) AS mean_ns,
    min(dur_ns) AS min_ns,
    max(dur_ns) AS max_ns,
    sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY run_id) AS share,
    avg(flops) AS flops,
    sum(flops) / nullif(sum(dur_ns) FILTER (WHERE flops IS NOT NULL), 0) / 1e3 AS tflops_per_s
FROM operators
GROUP BY run_id, family, phase, coalesce(cpu_op_name, name), input_dims, dtype;

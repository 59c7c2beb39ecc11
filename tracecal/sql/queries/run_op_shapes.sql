-- run_op_shapes: the distinct compute operator calls of one run, for `tracecal samples measure compute --from-run`.
-- Parameter $1: run_id. One row per (family, cpu_op_name, input_dims, input_types, phase, causal) among
-- the run's operators of compute families, with how often and how long that call ran.
-- Columns:
--   family       op family of the operators (decode's classification, docs/decode.md#families)
--   cpu_op_name  innermost CPU operator (aten::mm, ...)
--   input_dims   Input Dims of the CPU operator as JSON text
--   input_types  Input type of the CPU operator as JSON text
--   phase        fwd, bwd, optimizer or other
--   causal       attention causality as decoded (NULL when unknown or not attention)
--   operators    operator rows (kernels, or CPU ops in CPU-only traces) with this call signature
--   total_ns     their summed duration, ns
SELECT
    family,
    cpu_op_name,
    input_dims,
    input_types,
    phase,
    causal,
    count(*) AS operators,
    sum(dur_ns) AS total_ns
FROM operators
WHERE run_id = $1
  AND family IN ('gemm', 'attention', 'softmax', 'norm', 'elementwise', 'embedding', 'loss', 'optimizer')
  AND cpu_op_name IS NOT NULL
GROUP BY ALL
ORDER BY total_ns DESC NULLS LAST, cpu_op_name, input_dims, phase

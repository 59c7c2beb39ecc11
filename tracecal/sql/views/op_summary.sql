-- op_summary: operators grouped by run, family, phase, CPU operator and input shape.
CREATE OR REPLACE VIEW op_summary AS
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
COMMENT ON VIEW op_summary IS 'Operators per run by family, phase, CPU operator (kernel name when unlinked) and input shape';
COMMENT ON COLUMN op_summary.run_id IS 'run identifier';
COMMENT ON COLUMN op_summary.family IS 'op family (docs/decode.md#families)';
COMMENT ON COLUMN op_summary.phase IS 'fwd, bwd, optimizer, other (docs/decode.md#phases)';
COMMENT ON COLUMN op_summary.op IS 'innermost CPU operator, or the activity name when unlinked';
COMMENT ON COLUMN op_summary.input_dims IS 'Input Dims of the CPU operator as JSON text';
COMMENT ON COLUMN op_summary.dtype IS 'element type of the main input';
COMMENT ON COLUMN op_summary.count IS 'operator rows (GPU activities, or CPU ops on CPU-only runs) over all ranks and iterations';
COMMENT ON COLUMN op_summary.ranks IS 'ranks on which the group occurs';
COMMENT ON COLUMN op_summary.total_ns IS 'summed duration, ns';
COMMENT ON COLUMN op_summary.mean_ns IS 'mean duration, ns';
COMMENT ON COLUMN op_summary.min_ns IS 'shortest duration, ns';
COMMENT ON COLUMN op_summary.max_ns IS 'longest duration, ns';
COMMENT ON COLUMN op_summary.share IS 'share of the run''s summed operator time (0-1)';
COMMENT ON COLUMN op_summary.flops IS 'mean floating-point operations per operator from its shape (gemm, attention); NULL otherwise';
COMMENT ON COLUMN op_summary.tflops_per_s IS 'achieved TFLOP/s: summed flops over summed duration';

-- temporal_breakdown: per run and rank, where GPU time goes over the whole capture (HTA's
-- get_temporal_breakdown definitions): the span runs from the first GPU activity's start to the
-- last one's end; compute is the union of compute kernels (not NCCL, memcpy or memset);
-- communication is the union of NCCL kernels minus its overlap with compute; memory is memcpy /
-- memset time not overlapped by either; idle is the span minus the union of everything. The four
-- parts sum to the span. Ranks without GPU activity (CPU-only runs) have no rows.
CREATE OR REPLACE VIEW temporal_breakdown AS
WITH gpu AS (
    SELECT
        run_id, rank, ts_ns AS s, ts_ns + dur_ns AS e,
        CASE WHEN family = 'comm' THEN 2 WHEN kind IN ('memcpy', 'memset') THEN 3 ELSE 1 END AS cls
    FROM operators
    WHERE kind IN ('kernel', 'memcpy', 'memset') AND dur_ns IS NOT NULL
),
levels AS (
    -- level 1: compute; level 2: compute + communication; level 3: everything
    SELECT gpu.*, l.level FROM gpu JOIN (VALUES (1), (2), (3)) AS l(level) ON gpu.cls <= l.level
),
busy AS (
    -- union length of the classes up to level (macros/interval_union.sql)
    SELECT run_id, rank, level, union_ns AS busy_ns FROM interval_union('levels')
),
span AS (
    SELECT run_id, rank, min(s) AS start_ns, max(e) AS end_ns FROM gpu GROUP BY ALL
),
parts AS (
    SELECT
        span.run_id, span.rank, span.end_ns - span.start_ns AS span_ns,
        coalesce(max(busy_ns) FILTER (WHERE level = 1), 0) AS u1,
        coalesce(max(busy_ns) FILTER (WHERE level = 2), 0) AS u2,
        coalesce(max(busy_ns) FILTER (WHERE level = 3), 0) AS u3
    FROM span LEFT JOIN busy USING (run_id, rank)
    GROUP BY ALL
)
SELECT
    run_id,
    rank,
    span_ns,
    u1 AS compute_ns,
    u2 - u1 AS communication_ns,
    u3 - u2 AS memory_ns,
    span_ns - u3 AS idle_ns,
    100.0 * u1 / nullif(span_ns, 0) AS compute_pct,
    100.0 * (u3 - u1) / nullif(span_ns, 0) AS non_compute_pct,
    100.0 * (span_ns - u3) / nullif(span_ns, 0) AS idle_pct
FROM parts;
COMMENT ON VIEW temporal_breakdown IS 'Per run and rank over the whole capture: compute, communication, memory and idle GPU time (HTA definitions; parts sum to the span)';
COMMENT ON COLUMN temporal_breakdown.run_id IS 'run identifier';
COMMENT ON COLUMN temporal_breakdown.rank IS 'global rank';
COMMENT ON COLUMN temporal_breakdown.span_ns IS 'first GPU activity start to last GPU activity end, ns (HTA kernel_time)';
COMMENT ON COLUMN temporal_breakdown.compute_ns IS 'union of compute kernels (not NCCL/memcpy/memset), ns';
COMMENT ON COLUMN temporal_breakdown.communication_ns IS 'union of NCCL kernels not overlapped by compute, ns';
COMMENT ON COLUMN temporal_breakdown.memory_ns IS 'memcpy/memset time not overlapped by compute or communication, ns';
COMMENT ON COLUMN temporal_breakdown.idle_ns IS 'span with no GPU activity at all, ns';
COMMENT ON COLUMN temporal_breakdown.compute_pct IS 'compute share of the span, % (HTA compute_time_pctg)';
COMMENT ON COLUMN temporal_breakdown.non_compute_pct IS 'communication + memory share of the span, % (HTA non_compute_time_pctg)';
COMMENT ON COLUMN temporal_breakdown.idle_pct IS 'idle share of the span, % (HTA idle_time_pctg)';

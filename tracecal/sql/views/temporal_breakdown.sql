-- Per run and rank over the whole capture: compute, communication, memory and idle GPU time (HTA definitions;
-- parts sum to the span)
--
-- HTA's get_temporal_breakdown definitions: the span runs from the first GPU activity's start to the last
-- one's end; compute is the union of compute kernels (not NCCL, memcpy or memset); communication is the
-- union of NCCL kernels minus its overlap with compute; memory is memcpy / memset time not overlapped by
-- either; idle is the span minus the union of everything. The four parts sum to the span. Ranks without GPU
-- activity (CPU-only runs) have no rows.
--
-- depends on: operators, interval_union
--
-- columns:
--   run_id: run identifier
--   rank: global rank
--   span_ns: first GPU activity start to last GPU activity end, ns (HTA kernel_time)
--   compute_ns: union of compute kernels (not NCCL/memcpy/memset), ns
--   communication_ns: union of NCCL kernels not overlapped by compute, ns
--   memory_ns: memcpy/memset time not overlapped by compute or communication, ns
--   idle_ns: span with no GPU activity at all, ns
--   compute_pct: compute share of the span, % (HTA compute_time_pctg)
--   non_compute_pct: communication + memory share of the span, % (HTA non_compute_time_pctg)
--   idle_pct: idle share of the span, % (HTA idle_time_pctg)

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

-- interval_union: the length of the union of intervals, per run, rank and level.
--
-- Argument: the name of a relation (a table, a view or a CTE of the calling query) with columns
-- run_id, rank, level, s and e: intervals [s, e) in ns; other columns are ignored. Returns one row per
-- (run_id, rank, level) that has intervals, with union_ns: the time covered by at least one of them,
-- counted once where they overlap. An interval with e <= s covers nothing.
--
-- Intervals are walked in start order; each adds the part of it past the latest end before it
-- (covered_until), which is exactly what it adds to the union of the intervals that start no later.
-- Used by component_breakdown and temporal_breakdown, which pass one level per priority class.
CREATE OR REPLACE MACRO interval_union(intervals) AS TABLE
WITH ordered AS (
    SELECT run_id, rank, level, s, e, max(e) OVER (
        PARTITION BY run_id, rank, level ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
    ) AS covered_until
    FROM query_table(intervals)
)
SELECT run_id, rank, level, sum(greatest(e - greatest(s, coalesce(covered_until, s)), 0))::BIGINT AS union_ns
FROM ordered
GROUP BY run_id, rank, level;

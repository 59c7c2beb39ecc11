-- Per run: the iteration whose slowest rank is fastest (min over iterations of max over ranks of the
-- iteration time)
--
-- Defined in docs/decode.md#iterations. Only iterations recorded on every rank compete (when any is); ties
-- go to the lower index.
--
-- depends on: iterations
--
-- columns:
--   run_id: run identifier
--   iteration: the best iteration index (ProfilerStep#N, or marker order; 0 when the capture is one
--     iteration)
--   dur_ns: iteration time of the slowest rank in the best iteration (GPU span, else CPU span), ns
--   slowest_rank: rank with the longest span in the best iteration
--   fastest_rank: rank with the shortest span in the best iteration
--   fastest_rank_ns: span of the fastest rank, ns
--   ranks: ranks that recorded this iteration
--   on_all_ranks: true when every rank of the run recorded this iteration
--   aligned_span_ns: latest aligned end minus earliest aligned start over ranks (clock-aligned,
--     docs/decode.md#clock-alignment), ns
--   has_marker: false when a rank had no iteration markers and its capture counts as one iteration

WITH per_iteration AS (
    SELECT
        run_id,
        iteration,
        max(dur_ns) AS dur_ns,
        arg_max(rank, dur_ns) AS slowest_rank,
        arg_min(rank, dur_ns) AS fastest_rank,
        min(dur_ns) AS fastest_rank_ns,
        count(DISTINCT rank) AS ranks,
        max(aligned_end_ns) - min(aligned_start_ns) AS aligned_span_ns,
        bool_and(marker IS NOT NULL) AS has_marker
    FROM iterations
    GROUP BY run_id, iteration
),
run_ranks AS (
    SELECT run_id, count(DISTINCT rank) AS n FROM iterations GROUP BY run_id
),
ranked AS (
    SELECT
        p.*,
        p.ranks = r.n AS on_all_ranks,
        row_number() OVER (PARTITION BY p.run_id ORDER BY (p.ranks = r.n) DESC, p.dur_ns, p.iteration) AS pick
    FROM per_iteration AS p
    JOIN run_ranks AS r USING (run_id)
)
SELECT run_id, iteration, dur_ns, slowest_rank, fastest_rank, fastest_rank_ns, ranks, on_all_ranks,
       aligned_span_ns, has_marker
FROM ranked
WHERE pick = 1;

-- Collectives per run by group role, collective, payload and group size: count, time, algbw and busbw
-- (nccl-tests)
--
-- Rows are the collective or p2p instances of the collectives table, grouped; bandwidths follow nccl-tests'
-- definitions (docs/decode.md).
--
-- depends on: collectives
--
-- columns:
--   run_id: run identifier
--   role: group role: tp, dp, pp, ep, cp, unknown
--   collective: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, send, recv, barrier,
--     other
--   size_bytes: payload in bytes (nccl-tests S); NULL when the trace does not say
--   group_size: ranks in the process group
--   dtype: element type
--   count: instance rows over all ranks
--   ranks: ranks that recorded them
--   instances: distinct matched instances (match ids)
--   unmatched: rows without a match id (single-rank runs, or not recorded on another rank)
--   total_ns: summed kernel (or gloo work) time, ns
--   mean_ns: mean duration, ns
--   min_ns: shortest duration, ns
--   algbw_gbps: mean algorithm bandwidth size/time, GB/s
--   busbw_gbps: mean bus bandwidth (algbw x 2(n-1)/n all-reduce, (n-1)/n gather/scatter/all-to-all, 1
--     otherwise), GB/s
--   max_busbw_gbps: best bus bandwidth observed, GB/s

SELECT
    run_id,
    role,
    name AS collective,
    size_bytes,
    group_size,
    dtype,
    count(*) AS count,
    count(DISTINCT rank) AS ranks,
    count(DISTINCT match_id) AS instances,
    count(*) FILTER (WHERE match_id IS NULL) AS unmatched,
    sum(dur_ns) AS total_ns,
    avg(dur_ns) AS mean_ns,
    min(dur_ns) AS min_ns,
    avg(algbw_gbps) AS algbw_gbps,
    avg(busbw_gbps) AS busbw_gbps,
    max(busbw_gbps) AS max_busbw_gbps
FROM collectives
GROUP BY ALL;

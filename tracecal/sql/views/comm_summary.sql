-- comm_summary: collectives per run by role, collective, size and group size, with nccl-tests bandwidths.
CREATE OR REPLACE VIEW comm_summary AS
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
COMMENT ON VIEW comm_summary IS 'Collectives per run by group role, collective, payload and group size: count, time, algbw and busbw (nccl-tests)';
COMMENT ON COLUMN comm_summary.run_id IS 'run identifier';
COMMENT ON COLUMN comm_summary.role IS 'group role: tp, dp, pp, ep, cp, unknown';
COMMENT ON COLUMN comm_summary.collective IS 'all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, send, recv, barrier, other';
COMMENT ON COLUMN comm_summary.size_bytes IS 'payload in bytes (nccl-tests S); NULL when the trace does not say';
COMMENT ON COLUMN comm_summary.group_size IS 'ranks in the process group';
COMMENT ON COLUMN comm_summary.dtype IS 'element type';
COMMENT ON COLUMN comm_summary.count IS 'instance rows over all ranks';
COMMENT ON COLUMN comm_summary.ranks IS 'ranks that recorded them';
COMMENT ON COLUMN comm_summary.instances IS 'distinct matched instances (match ids)';
COMMENT ON COLUMN comm_summary.unmatched IS 'rows without a match id (single-rank runs, or not recorded on another rank)';
COMMENT ON COLUMN comm_summary.total_ns IS 'summed kernel (or gloo work) time, ns';
COMMENT ON COLUMN comm_summary.mean_ns IS 'mean duration, ns';
COMMENT ON COLUMN comm_summary.min_ns IS 'shortest duration, ns';
COMMENT ON COLUMN comm_summary.algbw_gbps IS 'mean algorithm bandwidth size/time, GB/s';
COMMENT ON COLUMN comm_summary.busbw_gbps IS 'mean bus bandwidth (algbw x 2(n-1)/n all-reduce, (n-1)/n gather/scatter/all-to-all, 1 otherwise), GB/s';
COMMENT ON COLUMN comm_summary.max_busbw_gbps IS 'best bus bandwidth observed, GB/s';

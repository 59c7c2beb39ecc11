-- kernel_breakdown: GPU activity per run by kernel (or memcpy/memset) name.
CREATE OR REPLACE VIEW kernel_breakdown AS
SELECT
    run_id,
    kind,
    name,
    family,
    count(*) AS count,
    count(DISTINCT rank) AS ranks,
    count(DISTINCT stream) AS streams,
    sum(dur_ns) AS total_ns,
    avg(dur_ns) AS mean_ns,
    median(dur_ns) AS median_ns,
    sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY run_id) AS share,
    count(*) FILTER (WHERE cpu_op_event_id IS NULL) AS unlinked
FROM operators
WHERE kind IN ('kernel', 'memcpy', 'memset')
GROUP BY run_id, kind, name, family;
COMMENT ON VIEW kernel_breakdown IS 'GPU kernels, memcpys and memsets per run by name, with their share of GPU activity time';
COMMENT ON COLUMN kernel_breakdown.run_id IS 'run identifier';
COMMENT ON COLUMN kernel_breakdown.kind IS 'kernel, memcpy or memset';
COMMENT ON COLUMN kernel_breakdown.name IS 'kernel / activity name';
COMMENT ON COLUMN kernel_breakdown.family IS 'op family (docs/decode.md#families) of the activity';
COMMENT ON COLUMN kernel_breakdown.count IS 'activities over all ranks';
COMMENT ON COLUMN kernel_breakdown.ranks IS 'ranks that ran it';
COMMENT ON COLUMN kernel_breakdown.streams IS 'distinct GPU streams it ran on';
COMMENT ON COLUMN kernel_breakdown.total_ns IS 'summed duration, ns';
COMMENT ON COLUMN kernel_breakdown.mean_ns IS 'mean duration, ns';
COMMENT ON COLUMN kernel_breakdown.median_ns IS 'median duration, ns';
COMMENT ON COLUMN kernel_breakdown.share IS 'share of the run''s summed GPU activity time (0-1)';
COMMENT ON COLUMN kernel_breakdown.unlinked IS 'activities with no CPU operator (launched before the capture, or sampled out)';

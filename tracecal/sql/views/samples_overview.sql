-- samples_overview: what `tracecal samples list` shows, one row per cluster, family, op, direction
-- and source, with how many samples are stored and how many are flagged as implausible.
CREATE OR REPLACE VIEW samples_overview AS
SELECT
    cluster,
    family,
    op,
    direction,
    source,
    string_agg(DISTINCT device_name, ', ' ORDER BY device_name) AS devices,
    nullif(array_to_string(list_sort(list_distinct(list(tp))), ','), '') AS tp_values,
    nullif(array_to_string(list_sort(list_distinct(list(
        CASE WHEN nodes IS NOT NULL AND gpus_per_node IS NOT NULL THEN nodes || 'x' || gpus_per_node END
    ))), ','), '') AS topologies,
    count(*) AS samples,
    count(quality_flag) AS flagged,
    count(DISTINCT source_file) AS files,
    min(median_ns) AS min_median_ns,
    max(median_ns) AS max_median_ns,
    max(sampled_at) AS last_sampled_at
FROM samples
GROUP BY ALL;
COMMENT ON VIEW samples_overview IS 'Stored samples per cluster, family, op, direction and source, with flagged counts';
COMMENT ON COLUMN samples_overview.cluster IS 'cluster name';
COMMENT ON COLUMN samples_overview.family IS 'op family (docs/decode.md#families) or comm';
COMMENT ON COLUMN samples_overview.op IS 'published op name or sampled op';
COMMENT ON COLUMN samples_overview.direction IS 'fwd or bwd';
COMMENT ON COLUMN samples_overview.source IS 'sampler or imported:<format>';
COMMENT ON COLUMN samples_overview.devices IS 'device names that took the samples, comma-separated';
COMMENT ON COLUMN samples_overview.tp_values IS 'tensor-parallel sizes the shapes were derived for (published samples), comma-separated; NULL when none: a model asked for another TP size extrapolates';
COMMENT ON COLUMN samples_overview.topologies IS 'nodes x GPUs per node of comm samples, comma-separated; NULL for compute';
COMMENT ON COLUMN samples_overview.samples IS 'stored samples';
COMMENT ON COLUMN samples_overview.flagged IS 'samples with a quality_flag (excluded from calibration)';
COMMENT ON COLUMN samples_overview.files IS 'distinct source files (imported) or configs (sampled)';
COMMENT ON COLUMN samples_overview.min_median_ns IS 'smallest median duration, ns';
COMMENT ON COLUMN samples_overview.max_median_ns IS 'largest median duration, ns';
COMMENT ON COLUMN samples_overview.last_sampled_at IS 'when the newest sample was taken or imported (UTC)';

-- Stored samples per cluster, family, op, direction and source, with flagged counts
--
-- What `tracecal samples list` shows.
--
-- depends on: samples
--
-- columns:
--   cluster: cluster name
--   family: op family (docs/decode.md#families) or comm
--   op: published op name or sampled op
--   direction: fwd or bwd
--   source: sampler or imported:<format>
--   devices: device names that took the samples, comma-separated
--   tp_values: tensor-parallel sizes the shapes were derived for (published samples), comma-separated; NULL
--     when none: a model asked for another TP size extrapolates
--   topologies: nodes x GPUs per node of comm samples, comma-separated; NULL for compute
--   samples: stored samples
--   flagged: samples with a quality_flag (excluded from calibration)
--   files: distinct source files (imported) or configs (sampled)
--   min_median_ns: smallest median duration, ns
--   max_median_ns: largest median duration, ns
--   last_sampled_at: when the newest sample was taken or imported (UTC)

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

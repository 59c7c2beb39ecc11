-- Flagged samples per cluster, reason, family and op
--
-- quality_flag is "reason: detail"; the reason is the part before the colon (tracecal.samplers.quality
-- documents the rules).
--
-- depends on: samples
--
-- columns:
--   cluster: cluster name
--   reason: quality rule that flagged the samples (see tracecal/samplers/quality.py)
--   family: op family or comm
--   op: published op name or sampled op
--   samples: flagged samples

SELECT
    cluster,
    split_part(quality_flag, ':', 1) AS reason,
    family,
    op,
    count(*) AS samples
FROM samples
WHERE quality_flag IS NOT NULL
GROUP BY ALL;

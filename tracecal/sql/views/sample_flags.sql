-- sample_flags: flagged (implausible) samples counted per cluster, reason, family and op.
-- quality_flag is "reason: detail"; the reason is the part before the colon
-- (tracecal.samplers.quality documents the rules).
CREATE OR REPLACE VIEW sample_flags AS
SELECT
    cluster,
    split_part(quality_flag, ':', 1) AS reason,
    family,
    op,
    count(*) AS samples
FROM samples
WHERE quality_flag IS NOT NULL
GROUP BY ALL;
COMMENT ON VIEW sample_flags IS 'Flagged samples per cluster, reason, family and op';
COMMENT ON COLUMN sample_flags.cluster IS 'cluster name';
COMMENT ON COLUMN sample_flags.reason IS 'quality rule that flagged the samples (see tracecal/samplers/quality.py)';
COMMENT ON COLUMN sample_flags.family IS 'op family or comm';
COMMENT ON COLUMN sample_flags.op IS 'published op name or sampled op';
COMMENT ON COLUMN sample_flags.samples IS 'flagged samples';

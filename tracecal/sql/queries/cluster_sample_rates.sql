-- cluster_sample_rates: the rate every plausible sample of two clusters reached (what_if.cluster_ratios).
-- Parameters: source cluster, target cluster, the compute-bound families (a list of names).
-- Work per sample: flops for compute-bound families, the payload bytes for collectives (comm), and the
-- bytes read plus written (io_bytes) for every other family. Samples with a quality flag are left out.
--   cluster  the cluster
--   family   the op family
--   op       the sample's op (published name or sampled op)
--   work     flops or bytes of the sample
--   rate     work per ns (flop/ns or byte/ns) at the sample's median time
WITH work AS (
    SELECT
        cluster,
        family,
        op,
        median_ns,
        CASE
            WHEN family = 'comm' THEN size_bytes::DOUBLE
            WHEN list_contains($3, family) THEN flops
            ELSE io_bytes
        END AS work
    FROM samples
    WHERE cluster IN ($1, $2) AND quality_flag IS NULL AND median_ns > 0
)
SELECT cluster, family, op, work, work / median_ns AS rate
FROM work
WHERE work > 0

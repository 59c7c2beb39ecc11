-- GPU kernels, memcpys and memsets per run by name, with their share of GPU activity time
--
-- Only GPU activity: rows of operators whose kind is kernel, memcpy or memset.
--
-- depends on: operators
--
-- columns:
--   run_id: run identifier
--   kind: kernel, memcpy or memset
--   name: kernel / activity name
--   family: op family (docs/decode.md#families) of the activity
--   count: activities over all ranks
--   ranks: ranks that ran it
--   streams: distinct GPU streams it ran on
--   total_ns: summed duration, ns
--   mean_ns: mean duration, ns
--   median_ns: median duration, ns
--   share: share of the run's summed GPU activity time (0-1)
--   unlinked: activities with no CPU operator (launched before the capture, or sampled out)

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

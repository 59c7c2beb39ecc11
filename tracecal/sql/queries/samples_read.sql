-- The samples of one cluster, for calibration (tracecal.sql.samples.read_samples).
-- $1 cluster; $2 family or NULL for all; $3 direction or NULL for all;
-- $4 true to keep samples with a quality_flag, false to drop them.
SELECT *
FROM samples
WHERE cluster = $1
  AND ($2::VARCHAR IS NULL OR family = $2)
  AND ($3::VARCHAR IS NULL OR direction = $3)
  AND ($4::BOOLEAN OR quality_flag IS NULL)
ORDER BY family, op, direction, sample_id

-- iterations_clocks: per rank of a run ($1), the clock alignment and collective matching (docs/decode.md#clock-alignment).
--   rank               global rank
--   clock_offset_us    offset added to the rank's timestamps, µs (NULL: no matched collective)
--   residual_us        median |aligned end - instance centre| over matched collectives, µs
--   collectives        collective instances recorded on the rank
--   matched            of which matched across ranks
SELECT
    k.rank,
    round(k.clock_offset_ns / 1e3, 3) AS clock_offset_us,
    round(k.clock_residual_ns / 1e3, 3) AS residual_us,
    count(c.event_id) AS collectives,
    count(c.match_id) AS matched
FROM ranks AS k
LEFT JOIN collectives AS c ON c.run_id = k.run_id AND c.rank = k.rank
WHERE k.run_id = $1
GROUP BY k.rank, k.clock_offset_ns, k.clock_residual_ns
ORDER BY k.rank;

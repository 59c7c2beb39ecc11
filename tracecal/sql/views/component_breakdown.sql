-- Best iteration per run and rank: exclusive time per component (docs/decode.md#components) plus idle; sums
-- to the rank's iteration span
--
-- Where activities of several components overlap, the instant goes to the first in priority order
-- compute_bwd, compute_fwd, optimizer, comm_tp, comm_pp, comm_dp, comm_ep, comm_other, memcpy, other (so
-- communication counts only where it is exposed). Activities are clipped to the rank's iteration span; the
-- rows of a rank sum to span_ns.
--
-- depends on: iterations, operators, best_iteration, interval_union
--
-- columns:
--   run_id: run identifier
--   rank: global rank
--   iteration: the run's best iteration
--   component: compute_fwd, compute_bwd, optimizer, comm_tp, comm_dp, comm_pp, comm_ep, comm_other, memcpy,
--     other, idle
--   time_ns: time attributed to the component (overlaps go to the higher-priority component), ns
--   span_ns: the rank's span of the best iteration (GPU span, else CPU window), ns
--   share: time_ns / span_ns (0-1)

WITH priority(component, prio) AS (
    VALUES ('compute_bwd', 1), ('compute_fwd', 2), ('optimizer', 3), ('comm_tp', 4), ('comm_pp', 5),
           ('comm_dp', 6), ('comm_ep', 7), ('comm_other', 8), ('memcpy', 9), ('other', 10)
),
span AS (
    SELECT i.run_id, i.rank, i.iteration,
           coalesce(i.gpu_start_ns, i.cpu_start_ns) AS start_ns,
           coalesce(i.gpu_end_ns, i.cpu_end_ns) AS end_ns
    FROM iterations AS i
    JOIN best_iteration AS b ON b.run_id = i.run_id AND b.iteration = i.iteration
),
ops AS (
    SELECT o.run_id, o.rank, p.prio,
           greatest(o.ts_ns, span.start_ns) AS s,
           least(o.ts_ns + o.dur_ns, span.end_ns) AS e
    FROM operators AS o
    JOIN span ON span.run_id = o.run_id AND span.rank = o.rank AND span.iteration = o.iteration
    JOIN priority AS p ON p.component = o.component
    WHERE o.dur_ns IS NOT NULL
),
levels AS (
    SELECT ops.run_id, ops.rank, ops.s, ops.e, l.level
    FROM ops JOIN (SELECT prio AS level FROM priority) AS l ON ops.prio <= l.level
    WHERE ops.e > ops.s
),
busy AS (
    -- union length of all components with priority <= level (macros/interval_union.sql)
    SELECT run_id, rank, level, union_ns AS busy_ns FROM interval_union('levels')
),
grid AS (
    SELECT span.*, p.component, p.prio FROM span CROSS JOIN priority AS p
),
exclusive AS (
    SELECT g.run_id, g.rank, g.iteration, g.component, g.prio, g.end_ns - g.start_ns AS span_ns,
           coalesce(cur.busy_ns, prev.busy_ns, 0) - coalesce(prev.busy_ns, 0) AS time_ns
    FROM grid AS g
    LEFT JOIN busy AS cur ON cur.run_id = g.run_id AND cur.rank = g.rank AND cur.level = g.prio
    LEFT JOIN busy AS prev ON prev.run_id = g.run_id AND prev.rank = g.rank AND prev.level = g.prio - 1
),
with_idle AS (
    SELECT run_id, rank, iteration, component, prio, span_ns, time_ns FROM exclusive WHERE time_ns > 0
    UNION ALL
    SELECT g.run_id, g.rank, g.iteration, 'idle', 11, g.end_ns - g.start_ns,
           g.end_ns - g.start_ns - coalesce((SELECT max(busy_ns) FROM busy AS b
                                             WHERE b.run_id = g.run_id AND b.rank = g.rank), 0)
    FROM span AS g
)
SELECT run_id, rank, iteration, component, time_ns, span_ns, time_ns / nullif(span_ns, 0) AS share
FROM with_idle
ORDER BY run_id, rank, prio;

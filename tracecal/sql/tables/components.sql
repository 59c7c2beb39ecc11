-- components: Per run, rank and component: measured vs predicted time of the best iteration and the error.
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS components (
    run_id         VARCHAR,
    cluster        VARCHAR,
    mode           VARCHAR,
    rank           INTEGER,
    component      VARCHAR,
    measured_ns    BIGINT,
    predicted_ns   BIGINT,
    error_pct      DOUBLE,
    covered_share  DOUBLE,
    replay         VARCHAR,
    unexplained_ns BIGINT
);
COMMENT ON TABLE components IS 'Per run, rank and component: measured vs predicted time of the best iteration and the error.';
COMMENT ON COLUMN components.run_id IS 'run identifier';
COMMENT ON COLUMN components.cluster IS 'cluster whose models predicted (NULL in measured mode)';
COMMENT ON COLUMN components.mode IS 'measured, predicted, or scaled';
COMMENT ON COLUMN components.rank IS 'global rank';
COMMENT ON COLUMN components.component IS 'compute_fwd, compute_bwd, optimizer, other (compute of unknown phase), comm_tp, comm_dp, comm_pp, comm_ep, comm_other, memcpy, idle, or iteration (the whole iteration)';
COMMENT ON COLUMN components.measured_ns IS 'measured time of the component in the best iteration: each instant counts once, for the first active component in the order above, so comm_* is exposed communication and the components of a rank add up to its iteration';
COMMENT ON COLUMN components.predicted_ns IS 'replayed time of the component (same accounting)';
COMMENT ON COLUMN components.error_pct IS '(predicted − measured) / measured × 100; NULL when measured is 0';
COMMENT ON COLUMN components.covered_share IS 'share of the component''s measured time predicted by a model (0–1)';
COMMENT ON COLUMN components.replay IS 'fitted (the slack the dependency graph cannot explain kept as fixed lags) or dependency (only dependencies and nominal lags); NULL in rows written before both were stored';
COMMENT ON COLUMN components.unexplained_ns IS 'absorbed slack on the rank''s critical path of the fitted replay landing before this component''s operators (iteration: all of it); 0 in the dependency replay';

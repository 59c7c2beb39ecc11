-- predictions: Per operator of a replayed best iteration: measured and predicted duration and replayed times.
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS predictions (
    run_id           VARCHAR,
    cluster          VARCHAR,
    mode             VARCHAR,
    rank             INTEGER,
    event_id         BIGINT,
    family           VARCHAR,
    component        VARCHAR,
    measured_dur_ns  BIGINT,
    predicted_dur_ns BIGINT,
    duration_source  VARCHAR,
    replay_start_ns  BIGINT,
    replay_end_ns    BIGINT,
    replay           VARCHAR,
    unexplained_ns   BIGINT
);
COMMENT ON TABLE predictions IS 'Per operator of a replayed best iteration: measured and predicted duration and replayed times.';
COMMENT ON COLUMN predictions.run_id IS 'run identifier';
COMMENT ON COLUMN predictions.cluster IS 'cluster whose models predicted (NULL in measured mode)';
COMMENT ON COLUMN predictions.mode IS 'measured, predicted, or scaled';
COMMENT ON COLUMN predictions.rank IS 'global rank';
COMMENT ON COLUMN predictions.event_id IS 'events.event_id of the operator';
COMMENT ON COLUMN predictions.family IS 'op family';
COMMENT ON COLUMN predictions.component IS 'component (docs/decode.md#components)';
COMMENT ON COLUMN predictions.measured_dur_ns IS 'duration in the trace';
COMMENT ON COLUMN predictions.predicted_dur_ns IS 'replayed duration (end − start; a collective member includes its wait for the last member)';
COMMENT ON COLUMN predictions.duration_source IS 'model, measured (uncovered), or scale';
COMMENT ON COLUMN predictions.replay_start_ns IS 'start in the replay, relative to the rank''s replayed iteration start';
COMMENT ON COLUMN predictions.replay_end_ns IS 'end in the replay, relative to the rank''s replayed iteration start';
COMMENT ON COLUMN predictions.replay IS 'fitted (the slack the dependency graph cannot explain kept as fixed lags) or dependency (only dependencies and nominal lags); NULL in rows written before both were stored';
COMMENT ON COLUMN predictions.unexplained_ns IS 'absorbed slack on the rank''s critical path of the fitted replay just before this operator (0 in the dependency replay, which has none)';

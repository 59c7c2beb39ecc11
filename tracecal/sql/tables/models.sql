-- models: Calibrated regressors per cluster, family, direction (and op / topology), with validation errors.
-- Generated from tracecal/schema.py by `python -m tracecal.schema`; edit the schema, not this file.
CREATE TABLE IF NOT EXISTS models (
    model_id         VARCHAR,
    cluster          VARCHAR,
    family           VARCHAR,
    direction        VARCHAR,
    op               VARCHAR,
    topology         VARCHAR,
    model_kind       VARCHAR,
    hyperparams_json VARCHAR,
    features_json    VARCHAR,
    n_train          INTEGER,
    n_test           INTEGER,
    n_excluded       INTEGER,
    mape             DOUBLE,
    p50_ape          DOUBLE,
    p90_ape          DOUBLE,
    max_ape          DOUBLE,
    published_mape   DOUBLE,
    cv_mape          DOUBLE,
    noise_ape        DOUBLE,
    protocol         VARCHAR,
    status           VARCHAR,
    data_fingerprint VARCHAR,
    artifact_path    VARCHAR,
    schema_version   INTEGER,
    created_at       TIMESTAMP
);
COMMENT ON TABLE models IS 'Calibrated regressors per cluster, family, direction (and op / topology), with validation errors.';
COMMENT ON COLUMN models.model_id IS 'artifact id (directory name in the model store)';
COMMENT ON COLUMN models.cluster IS 'cluster name';
COMMENT ON COLUMN models.family IS 'op family or comm';
COMMENT ON COLUMN models.direction IS 'fwd or bwd';
COMMENT ON COLUMN models.op IS 'source op or collective the model serves; NULL when the whole family';
COMMENT ON COLUMN models.topology IS 'nodes x gpus_per_node for collectives; NULL otherwise';
COMMENT ON COLUMN models.model_kind IS 'physical, random_forest, xgboost, blend (forest x booster), local (smoother along log size), local_forest (smoother x forest)';
COMMENT ON COLUMN models.hyperparams_json IS 'chosen hyper-parameters as JSON text';
COMMENT ON COLUMN models.features_json IS 'feature column list as JSON text';
COMMENT ON COLUMN models.n_train IS 'training samples';
COMMENT ON COLUMN models.n_test IS 'hold-out samples';
COMMENT ON COLUMN models.n_excluded IS 'samples excluded by quality flags';
COMMENT ON COLUMN models.mape IS 'hold-out mean absolute percentage error, %';
COMMENT ON COLUMN models.p50_ape IS 'hold-out median absolute percentage error, %';
COMMENT ON COLUMN models.p90_ape IS 'hold-out 90th percentile absolute percentage error, %';
COMMENT ON COLUMN models.max_ape IS 'hold-out maximum absolute percentage error, %';
COMMENT ON COLUMN models.published_mape IS 'the published system''s hold-out error for the same op, %; NULL if unknown';
COMMENT ON COLUMN models.cv_mape IS 'k-fold cross-validated MAPE of the chosen model on the training rows, %';
COMMENT ON COLUMN models.noise_ape IS 'collectives: hold-out MAPE of a local median in size (replicate spread), %';
COMMENT ON COLUMN models.protocol IS 'hold-out split: published (GPUModeling25 80/20, random_state 42) or own';
COMMENT ON COLUMN models.status IS 'ok, or inconsistent: <why> (samples contradict themselves; model kept, flagged); groups with too few samples get no row';
COMMENT ON COLUMN models.data_fingerprint IS 'hash of the training samples';
COMMENT ON COLUMN models.artifact_path IS 'directory of the stored artifact';
COMMENT ON COLUMN models.schema_version IS 'artifact schema version';
COMMENT ON COLUMN models.created_at IS 'when the model was fitted (UTC)';

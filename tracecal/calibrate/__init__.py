"""Features, regressors, validation and the model store for calibrated operator cost models."""

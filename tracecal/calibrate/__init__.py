"""Features, regressors, validation and the model store for calibrated operator cost models."""

import os

# XGBoost's and scikit-learn's OpenMP workers busy-wait between parallel regions by default; on a
# shared 2-core machine that turns a 0.4 s boosting fit into 30 s. The policy only takes effect if set
# before the first OpenMP library loads (sklearn loads one too), hence at package import, and only
# when the user has not chosen one.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

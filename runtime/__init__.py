"""Runtime helpers every entry point shares: the Spark session (``spark``), atomic publishing of
outputs (``publish``), MLflow tracking (``tracking``) and progress logging (``logs``). Imports only
the contract (``prepared``)."""

import os

# MLflow's usage telemetry (on by default in MLflow 3) sets and unsets an environment variable
# from a background thread; a request that walks os.environ at that moment (requests' proxy
# lookup) fails with KeyError('_MLFLOW_TELEMETRY_SESSION_ID'). It killed an experiment's trial on
# 2026-11-27 ("API request ... failed with exception '_MLFLOW_TELEMETRY_SESSION_ID'"). Every entry
# point imports this package before MLflow, and the stack's Ray and MLflow processes inherit the
# setting; a user who sets MLFLOW_DISABLE_TELEMETRY=false keeps it on.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

#!/usr/bin/env bash
# A shared MLflow tracking server: PostgreSQL backend, artifacts in an object store, served through
# the server (clients need no bucket credentials).
#
#   MLFLOW_DB=postgresql://mlflow:PASSWORD@db:5432/mlflow \
#   MLFLOW_ARTIFACTS=s3://BUCKET/mlflow-artifacts infra/cluster/mlflow-server.sh
#
# Create the database once: createdb -O mlflow mlflow (Debian: apt-get install postgresql).
# Clients: --mlflow-uri http://HOST:5000 or MLFLOW_TRACKING_URI=http://HOST:5000.
set -euo pipefail
db=${MLFLOW_DB:?set MLFLOW_DB=postgresql://USER:PASSWORD@HOST:5432/mlflow}
artifacts=${MLFLOW_ARTIFACTS:?set MLFLOW_ARTIFACTS=s3://BUCKET/mlflow-artifacts}
exec mlflow server --host "${MLFLOW_HOST:-0.0.0.0}" --port "${MLFLOW_PORT:-5000}" \
  --backend-store-uri "$db" --artifacts-destination "$artifacts" --serve-artifacts \
  --workers "${MLFLOW_WORKERS:-4}"

#!/usr/bin/env bash
# A shared MLflow tracking server: PostgreSQL backend, artifacts in an object store, served through
# the server (clients need no bucket credentials). Nothing is served unauthenticated beyond loopback.
#
#   MLFLOW_DB=postgresql://mlflow:PASSWORD@db:5432/mlflow \
#   MLFLOW_ARTIFACTS=s3://BUCKET/mlflow-artifacts infra/cluster/mlflow-server.sh
#
# Default: binds 127.0.0.1 without auth, for a reverse proxy on the same host that terminates TLS
# and authenticates (infra/cluster/README.md, "Security"), or an ssh tunnel.
# MLFLOW_AUTH=basic: MLflow's basic-auth app, on 0.0.0.0 unless MLFLOW_HOST says otherwise.
#   MLFLOW_AUTH_ADMIN_PASSWORD   required; creates the admin user on first start (MLflow reads it)
#   MLFLOW_AUTH_ADMIN_USERNAME   default admin
#   MLFLOW_AUTH_DB               user store, default sqlite under MLFLOW_AUTH_DIR (~/.mlflow-auth);
#                                use a database of its own on the PostgreSQL server for a shared one
#   MLFLOW_FLASK_SERVER_SECRET_KEY  CSRF key; generated per start if unset (set it for >1 replica)
#   MLFLOW_AUTH_CONFIG_PATH      an ini of your own instead of the generated one
# A non-loopback MLFLOW_HOST without auth is refused, unless MLFLOW_BEHIND_PROXY=1 says a proxy that
# authenticates is the only way in (a firewall admits nothing else).
#
# Create the database once: createdb -O mlflow mlflow (Debian: apt-get install postgresql).
# Clients: --mlflow-uri http://HOST:5000 or MLFLOW_TRACKING_URI=http://HOST:5000, with basic auth
# also MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD.
set -euo pipefail
die() { echo "mlflow-server.sh: $*" >&2; exit 2; }
db=${MLFLOW_DB:?set MLFLOW_DB=postgresql://USER:PASSWORD@HOST:5432/mlflow}
artifacts=${MLFLOW_ARTIFACTS:?set MLFLOW_ARTIFACTS=s3://BUCKET/mlflow-artifacts}
auth=${MLFLOW_AUTH:-none}
case "$auth" in
  none) host=${MLFLOW_HOST:-127.0.0.1} ;;
  basic) host=${MLFLOW_HOST:-0.0.0.0} ;;
  *) die "MLFLOW_AUTH=$auth: expected none or basic" ;;
esac
args=(server --host "$host" --port "${MLFLOW_PORT:-5000}" --backend-store-uri "$db"
      --artifacts-destination "$artifacts" --serve-artifacts --workers "${MLFLOW_WORKERS:-4}")

if [[ $auth == none ]]; then
  case "$host" in
    127.*|localhost|::1|"[::1]") ;;
    *) [[ ${MLFLOW_BEHIND_PROXY:-0} == 1 ]] || die "refusing to serve $host without authentication:" \
         "set MLFLOW_AUTH=basic (MLflow's basic-auth app), or bind 127.0.0.1 behind a reverse proxy" \
         "(MLFLOW_BEHIND_PROXY=1 if the proxy is on another host and the only way in)" ;;
  esac
else
  [[ -n ${MLFLOW_AUTH_ADMIN_PASSWORD:-} ]] || die "MLFLOW_AUTH=basic needs MLFLOW_AUTH_ADMIN_PASSWORD" \
    "(the admin user's password; MLflow ships none)"
  if [[ -z ${MLFLOW_FLASK_SERVER_SECRET_KEY:-} ]]; then
    MLFLOW_FLASK_SERVER_SECRET_KEY=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    export MLFLOW_FLASK_SERVER_SECRET_KEY
  fi
  if [[ -z ${MLFLOW_AUTH_CONFIG_PATH:-} ]]; then
    # generated each start; 0600 since the store URI may hold a database password
    dir=${MLFLOW_AUTH_DIR:-$HOME/.mlflow-auth}
    store=${MLFLOW_AUTH_DB:-sqlite:///$dir/basic_auth.db}
    (umask 077 && mkdir -p "$dir" && printf '%s\n' "[mlflow]" "default_permission = READ" \
      "database_uri = ${store//'%'/%%}" "admin_username = admin" \
      "authorization_function = mlflow.server.auth:authenticate_request_basic_auth" \
      > "$dir/basic_auth.ini")   # %% because configparser interpolates %
    export MLFLOW_AUTH_CONFIG_PATH=$dir/basic_auth.ini
  fi
  args+=(--app-name basic-auth)
fi
exec mlflow "${args[@]}"

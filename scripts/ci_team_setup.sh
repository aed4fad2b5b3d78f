#!/usr/bin/env bash
# What tests/test_team.py and tests/test_lease.py need beyond the venv: Debian's PostgreSQL 15
# server binaries (/usr/lib/postgresql/15/bin) and psycopg 3 in the venv (the `team` extra).
# Idempotent: apt only when the binaries are missing, pip only when psycopg is missing.
# The tests start their own private cluster (initdb in /tmp, a free port on 127.0.0.1, run as
# the `postgres` user when root); the packaged `15/main` cluster is never used.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_BIN=/usr/lib/postgresql/15/bin
VENV=${VENV:-.venv}
if [ ! -x "$PG_BIN/postgres" ] || [ ! -x "$PG_BIN/initdb" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "ci_team_setup: PostgreSQL 15 is missing and installing it needs root (apt-get install postgresql)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends postgresql
fi
"$PG_BIN/postgres" --version
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c "import psycopg" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q -e '.[team]'
fi

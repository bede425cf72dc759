#!/usr/bin/env bash
# A local cluster in one command: PostgreSQL, Redis, three semantic instances and HAProxy on
# 127.0.0.1, all ordinary processes in a temporary directory; Ctrl-C stops them all.
#   scripts/cluster.sh [--instances 3] [--port 8000] [--dir DIR] [-- SERVE_FLAGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || ./scripts/setup.sh
exec .venv/bin/python -m reliability.cluster "$@"

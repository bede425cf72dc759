#!/usr/bin/env bash
# README step 1: set everything up, then serve the embedded model on http://127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/semantic serve "$@"

#!/usr/bin/env bash
# README step 2: the whole test suite (unit, integration on the real model, end to end).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || ./scripts/setup.sh
exec .venv/bin/python -m pytest "$@"

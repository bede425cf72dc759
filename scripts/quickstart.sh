#!/usr/bin/env bash
# README step 1: set everything up, then run semantic on the embedded model.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/semantic generate "${@:-What is the capital of France?}"

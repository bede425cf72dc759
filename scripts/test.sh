#!/usr/bin/env bash
# README step 2: the whole test suite (unit, integration on the real model, end to end).
#
# SEMANTIC_TEST_WORKERS=2: two worker processes (pytest-xdist). Alone, the suite leaves the
# CPUs idle nearly half the time, while a test waits for a server it started; two workers
# fill that. Each file runs on one worker, so a module's shared server starts once; each
# worker loads the real model once. One process by default (and in CI): a test that bounds
# a latency (the slow-client flood's 2 s) can miss it while the other worker computes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || ./scripts/setup.sh
workers="${SEMANTIC_TEST_WORKERS:-1}"
parallel=()
if [ "$workers" -gt 1 ]; then
    if .venv/bin/python -c "import xdist" 2>/dev/null; then
        parallel=(-n "$workers" --dist loadfile)
    else
        echo "pytest-xdist is missing (pip install -e '.[dev]'): the tests run in one process" >&2
    fi
fi
# (the guarded expansion: bash 3.2, macOS's own, calls an empty array unbound under set -u)
exec .venv/bin/python -m pytest ${parallel[@]+"${parallel[@]}"} "$@"

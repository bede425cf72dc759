#!/usr/bin/env bash
# README step 2: the whole test suite (unit, integration on the real model, end to end).
#
# Two worker processes (pytest-xdist) where the machine has two cores or more: alone, the
# suite leaves the CPUs idle nearly half the time while a test waits for a server it
# started, and two workers fill that. Each file runs on one worker, so a module's shared
# server starts once; each worker loads the real model once. The tests marked `alone`
# bound a latency (the slow-client flood's 2 s), which a machine busy with the other
# worker can miss: they run afterwards, in a pass of their own.
# SEMANTIC_TEST_WORKERS=N: N workers; 1: everything in this process, in one pass.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || ./scripts/setup.sh
cores="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)"
workers="${SEMANTIC_TEST_WORKERS:-$((cores >= 2 ? 2 : 1))}"
if [ "$workers" -gt 1 ] && ! .venv/bin/python -c "import xdist" 2>/dev/null; then
    echo "pytest-xdist is missing (pip install -e '.[dev]'): the tests run in one process" >&2
    workers=1
fi
if [ "$workers" -le 1 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
left="$(mktemp)"
trap 'rm -f "$left"' EXIT
status=0
.venv/bin/python -m pytest -n "$workers" --dist loadfile --alone=without --alone-left="$left" "$@" \
    || status=$?
# the alone pass where the selection held such tests, and the parallel pass ended in a
# result (0 passed, 1 failed, 5 had nothing else to run), not interrupted (2) or refused
if [ -s "$left" ] && { [ "$status" -le 1 ] || [ "$status" -eq 5 ]; }; then
    [ "$status" -eq 5 ] && status=0
    .venv/bin/python -m pytest --alone=only "$@" || { [ "$status" -ne 0 ] || status=$?; }
fi
exit "$status"

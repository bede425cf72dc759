#!/usr/bin/env bash
# Set up semantic on this machine: a fast BLAS (Linux), a virtualenv in .venv with the package
# and its dev tools, and the embedded model in the per-user model cache. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
"$PYTHON" - <<'PY' || { echo "semantic needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

# OpenBLAS: MLX's Linux CPU wheel bundles the reference BLAS, about 30x slower (ADR 0004).
if [ "$(uname -s)" = "Linux" ] && ! ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so\.0'; then
  SUDO=""
  [ "$(id -u)" = "0" ] || SUDO="sudo"
  if command -v apt-get >/dev/null 2>&1; then
    echo "installing OpenBLAS (libopenblas0-pthread) for fast matmuls..."
    $SUDO apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q libopenblas0-pthread >/dev/null; } \
      || echo "warning: could not install OpenBLAS; semantic will run, about 30x slower" >&2
  else
    echo "warning: no apt-get; install OpenBLAS with your package manager for speed" >&2
  fi
fi

# PostgreSQL (Debian's): the tests start their own server on loopback (metadata on PostgreSQL,
# ADR 0021); the system's own cluster is never used.
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = "0" ] || SUDO="sudo"
  echo "installing PostgreSQL (postgresql) for the tests..."
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null \
      && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null; } \
    || echo "warning: could not install PostgreSQL; the tests that use it will fail" >&2
fi

# Redis (Debian's redis-server): the shared block tier's tests start their own on loopback
# (ADR 0022); the system's service is never used.
if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = "0" ] || SUDO="sudo"
  echo "installing Redis (redis-server) for the tests..."
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null \
      && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; } \
    || echo "warning: could not install Redis; the tests that use it will fail" >&2
fi

# HAProxy (Debian's): the router of scripts/cluster.sh and the cluster tests, run as a plain
# process on loopback with deploy/haproxy.cfg (ADR 0023); the system's service is never used.
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = "0" ] || SUDO="sudo"
  echo "installing HAProxy (haproxy) for the local cluster..."
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null \
      && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null; } \
    || echo "warning: could not install HAProxy; the cluster tests will fail" >&2
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# MLX's backend on Linux is an extra: `cpu` here (`cuda` on an NVIDIA machine: SEMANTIC_EXTRAS=cuda).
.venv/bin/python -m pip install -q -e ".[${SEMANTIC_EXTRAS:-cpu},dev,bench]"
.venv/bin/semantic model pull

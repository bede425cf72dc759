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

SUDO=""
[ "$(id -u)" = "0" ] || SUDO="sudo"

# debian_package PACKAGE PRESENT WHY: install Debian's PACKAGE unless the command PRESENT
# succeeds (apt's lists are refreshed only if the first try fails); WHY says what it is for.
debian_package() {
  local package=$1 present=$2 why=$3
  if bash -c "$present" >/dev/null 2>&1; then return 0; fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "warning: no apt-get; install $package with your package manager ($why)" >&2
    return 0
  fi
  echo "installing $package ($why)..."
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null \
      && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null; } \
    || echo "warning: could not install $package ($why)" >&2
}

if [ "$(uname -s)" = "Linux" ]; then
  # MLX's Linux CPU wheel bundles the reference BLAS, about 30x slower (ADR 0004).
  debian_package libopenblas0-pthread "ldconfig -p | grep -q 'libopenblas\.so\.0'" \
    "fast matmuls; without it semantic runs about 30x slower"
  # The tests and scripts/cluster.sh start their own servers on loopback (ADRs 0021-0023);
  # the system's own services are never used.
  debian_package postgresql "ls /usr/lib/postgresql/*/bin/postgres" "metadata on PostgreSQL"
  debian_package redis-server "command -v redis-server" "the shared block tier"
  debian_package haproxy "command -v haproxy || [ -x /usr/sbin/haproxy ]" "the cluster's router"
  debian_package clang "command -v clang" "our C kernels built with clang too (a test)"
  # The dashboard's test drives the page in a real browser (ADR 0027).
  debian_package chromium "command -v chromium" "the dashboard's browser test"
  debian_package chromium-driver "command -v chromedriver" "the dashboard's browser test"
  if [ "$(uname -m)" = "x86_64" ]; then
    # The NEON variant of our kernels, cross-built and run under qemu-user (a test, ADR 0026).
    debian_package gcc-aarch64-linux-gnu "command -v aarch64-linux-gnu-gcc" "arm64 kernels (a test)"
    debian_package qemu-user "command -v qemu-aarch64" "arm64 kernels run here (a test)"
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# MLX's backend on Linux is an extra: `cpu` here (`cuda` on an NVIDIA machine: SEMANTIC_EXTRAS=cuda).
.venv/bin/python -m pip install -q -e ".[${SEMANTIC_EXTRAS:-cpu},dev,bench]"
.venv/bin/semantic model pull

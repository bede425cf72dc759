#!/usr/bin/env bash
# The device check: on a machine with an NVIDIA GPU, install semantic with MLX's CUDA
# backend and, within about 5 minutes, print what matters on that device: the 4K-history
# next turn from disk against cold (and warm == cold), decode tokens/s for 1 and 16 streams,
# and the conformance matrix. Unattended; everything it measures goes to standard output.
#
#   scripts/device-check.sh                      # GPU: a venv in .venv-device, pip install ".[cuda]"
#   scripts/device-check.sh --device cpu         # the dry run, on any machine (uses .venv)
#   scripts/device-check.sh --wheelhouse DIR     # offline: the wheels in DIR (no index) into
#                                                # a target folder, the checkout's sources run
#   scripts/device-check.sh --tokenizer DIR      # tokenizer files (default: the embedded model's)
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=gpu
WHEELHOUSE=""
TOKENIZER=""
BUDGET_S=${SEMANTIC_DEVICE_CHECK_BUDGET_S:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --wheelhouse) WHEELHOUSE=$2; shift 2 ;;
    --tokenizer) TOKENIZER=$2; shift 2 ;;
    *) echo "usage: $0 [--device gpu|cpu] [--wheelhouse DIR] [--tokenizer DIR]" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
if [ -n "$WHEELHOUSE" ]; then
  # A prefix, not --target: mlx and its backend wheel share the mlx/ folder, and --target
  # would let the second replace the first.
  PREFIX=${SEMANTIC_DEVICE_PREFIX:-/tmp/semantic-device}
  echo "installing the wheels in $WHEELHOUSE under $PREFIX (offline)"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --ignore-installed \
    --prefix "$PREFIX" "$WHEELHOUSE"/*.whl
  SITE="$PREFIX/$("$PYTHON" -c 'import sys; print("lib/python%d.%d/site-packages" % sys.version_info[:2])')"
  export PYTHONPATH="$PWD/src:$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  # libmlx.so finds NVIDIA's libraries relative to its own folder, which a prefix lacks: point
  # the loader at the machine's own (the pip packages of an image's PyTorch, say).
  NV=$("$PYTHON" -c 'import glob, nvidia; print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(p + "/*/lib"))))' 2>/dev/null || true)
  [ -n "$NV" ] && export LD_LIBRARY_PATH="$NV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif [ "$DEVICE" = "cpu" ]; then
  [ -x .venv/bin/python ] || ./scripts/setup.sh
  PYTHON=.venv/bin/python
else
  [ -x .venv-device/bin/python ] || "$PYTHON" -m venv .venv-device
  .venv-device/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv-device/bin/python -m pip install -q -e ".[cuda]" pytest
  PYTHON=.venv-device/bin/python
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# Five minutes on a GPU; a 2-core CPU needs about twice that for the same checks.
[ -n "$BUDGET_S" ] || { [ "$DEVICE" = "cpu" ] && BUDGET_S=720 || BUDGET_S=300; }
ARGS=(--device "$DEVICE" --budget-s "$BUDGET_S")
[ -n "$TOKENIZER" ] && ARGS+=(--tokenizer "$TOKENIZER")
exec "$PYTHON" -m benchmarks.device_check "${ARGS[@]}"

#!/usr/bin/env bash
# One-time set-up on a fresh machine: a .venv with CPU torch 2.13.0 and the harness installed
# editable (its pytest plugin registers through the pytest11 entry point). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import harness, torch, pandas, pyarrow, xdist" 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c ci/constraints-cpu.txt -e '.[test]'
fi
.venv/bin/python -c "import torch; print('torch', torch.__version__)"

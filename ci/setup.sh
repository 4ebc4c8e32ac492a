#!/usr/bin/env bash
# One-time set-up on a fresh machine: a .venv with CPU torch 2.13.0 and the harness installed
# editable (its pytest plugin registers through the pytest11 entry point). Idempotent.
# The install goes through uv, handed pip's own index, find-links and certificate settings and
# the same constraints; if uv cannot be installed or fails, pip installs as it always did. Both
# compile every installed module's bytecode at install time (uv --compile-bytecode; pip does by
# default): every process of a run imports torch, and where PYTHONDONTWRITEBYTECODE is set (as
# on the CI VM) an install without bytecode recompiles torch in each of them. (The harness's
# bytecode_cache acceleration keeps such bytecode in a cache of its own, harness/speed/
# bytecode_cache.py, but stands aside where torch has its bytecode: a cache prefix would hide it.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VPY=.venv/bin/python
[ -x "$VPY" ] || "$PY" -m venv .venv

pip_setting() {  # $1: pip's environment variable, $2: its config key; the value pip would use
  if [ -n "${!1:-}" ]; then echo "${!1}"; else "$VPY" -m pip config get "global.$2" 2>/dev/null || true; fi
}

uv_install() {  # uv pip install "$@" with pip's settings (best version over all indexes, as pip)
  local args=(--python "$VPY" --index-strategy unsafe-best-match --compile-bytecode -q) v
  v=$(pip_setting PIP_INDEX_URL index-url); [ -z "$v" ] || args+=(--index-url "$v")
  for v in $(pip_setting PIP_EXTRA_INDEX_URL extra-index-url); do args+=(--extra-index-url "$v"); done
  for v in $(pip_setting PIP_FIND_LINKS find-links); do args+=(--find-links "$v"); done
  v=$(pip_setting PIP_CERT cert); [ -z "$v" ] || export SSL_CERT_FILE="$v"
  "$VPY" -m pip install -q uv && "$VPY" -m uv pip install "${args[@]}" "$@"
}

# One interpreter checks an installed .venv and prints torch's version (CI runs this script
# twice: each torch import is seconds of a 2-core VM); a fresh one is checked after its install.
CHECK="import harness, torch, pandas, pyarrow, xdist; print('torch', torch.__version__)"
if ! "$VPY" -c "$CHECK" 2>/dev/null; then
  if ! uv_install -c ci/constraints-cpu.txt -e '.[test]'; then
    echo "uv could not install the harness; installing with pip"
    "$VPY" -m pip install -q --upgrade pip
    "$VPY" -m pip install -q -c ci/constraints-cpu.txt -e '.[test]'
  fi
  "$VPY" -c "$CHECK"
fi

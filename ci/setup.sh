#!/usr/bin/env bash
# One-time set-up on a fresh machine: a .venv with CPU torch 2.13.0 and the harness installed
# editable (its pytest plugin registers through the pytest11 entry point). Idempotent.
# The install goes through uv (on the 2-core CI VM ~8 s instead of pip's ~56 s, most of which
# compiled bytecode for every module of torch and the rest: reports/bench/README.md), handed
# pip's own index, find-links and certificate settings and the same constraints; if uv cannot be
# installed or fails, pip installs as it always did. Bytecode is written on first import, or,
# where PYTHONDONTWRITEBYTECODE forbids that, into the harness's own cache (harness/bytecode.py),
# which the import check below uses too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VPY=.venv/bin/python
[ -x "$VPY" ] || "$PY" -m venv .venv

pip_setting() {  # $1: pip's environment variable, $2: its config key; the value pip would use
  if [ -n "${!1:-}" ]; then echo "${!1}"; else "$VPY" -m pip config get "global.$2" 2>/dev/null || true; fi
}

uv_install() {  # uv pip install "$@" with pip's settings (best version over all indexes, as pip)
  local args=(--python "$VPY" --index-strategy unsafe-best-match -q) v
  v=$(pip_setting PIP_INDEX_URL index-url); [ -z "$v" ] || args+=(--index-url "$v")
  for v in $(pip_setting PIP_EXTRA_INDEX_URL extra-index-url); do args+=(--extra-index-url "$v"); done
  for v in $(pip_setting PIP_FIND_LINKS find-links); do args+=(--find-links "$v"); done
  v=$(pip_setting PIP_CERT cert); [ -z "$v" ] || export SSL_CERT_FILE="$v"
  "$VPY" -m pip install -q uv && "$VPY" -m uv pip install "${args[@]}" "$@"
}

CHECK="import harness.bytecode as b; b.use_here(); import harness, torch, pandas, pyarrow, xdist"
if ! "$VPY" -c "$CHECK" 2>/dev/null; then
  if ! uv_install -c ci/constraints-cpu.txt -e '.[test]'; then
    echo "uv could not install the harness; installing with pip"
    "$VPY" -m pip install -q --upgrade pip
    "$VPY" -m pip install -q -c ci/constraints-cpu.txt -e '.[test]'
  fi
fi
"$VPY" -c "$CHECK; print('torch', torch.__version__)"

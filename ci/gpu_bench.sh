#!/usr/bin/env bash
# The GPU figures of docs/performance.md on this host, in one command (a benchmark, not a test):
#   bash ci/gpu_bench.sh OUT [LABEL]
# Runs `python -m harness bench` on the TE matrix: the whole matrix twice (a fresh machine's
# first run, then warm) and its 2-rank half twice; on a host of several GPUs the same host with
# its first GPU alone after them (CUDA_VISIBLE_DEVICES=0: the one-GPU figure of the same host
# and code), and `python -m harness compare` of the two whole runs case by case (NCCL against
# ranks sharing one GPU). OUT gets LABEL-*.json (LABEL: default gpuN, N the GPUs nvidia-smi
# lists), LABEL-nccl-vs-gpu0.md and LABEL-stores.tar.gz (every run's history parquet). Each run
# is bounded by STEP_S seconds (default 300).
# Python and TE as the host has them (PYTHON, default python3; an offline bundle: source
# .tebundle/install.sh first). Leave PYTHONPYCACHEPREFIX unset on an image that may not write
# bytecode: the harness keeps its own cache there (docs/backends.md). BENCH_DRY=1 prints the
# commands instead of running them.
set -uo pipefail
out=$(mkdir -p "${1:?usage: bash ci/gpu_bench.sh OUT [LABEL]}" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
gpus=${BENCH_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
label=${2:-gpu$gpus}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
stores=$(mktemp -d)
trap 'rm -rf "$stores"' EXIT
failed=0

source ci/bench_lib.sh
run() {  # run NAME [VAR=VALUE] PYTEST-ARGS...: one bench, its results store kept for compare
  bench_te "$@" || failed=1
}

run whole-first
run whole
run 2rank-1 --max-world-size 2
run 2rank-2 --max-world-size 2
if [ "$gpus" -gt 1 ]; then
  run gpu0-whole CUDA_VISIBLE_DEVICES=0
  run gpu0-2rank CUDA_VISIBLE_DEVICES=0 --max-world-size 2
  cmp=("$py" -m harness compare --a "$stores/whole/history" --b "$stores/gpu0-whole/history"
       --label-a "$gpus GPUs" --label-b "GPU 0 alone (shared)" --out "$out/$label-nccl-vs-gpu0.md")
  if [ -n "${BENCH_DRY:-}" ]; then echo "${cmp[*]}"; else "${cmp[@]}" || failed=1; fi
fi
# every run's history parquet (its task records: what scaling.py and first uses read), one file
runs=()
for f in "$stores"/*/history/*.parquet; do [ -e "$f" ] && runs+=("${f#"$stores"/}"); done
keep=(tar -czf "$out/$label-stores.tar.gz" -C "$stores" ${runs[@]+"${runs[@]}"})
if [ -n "${BENCH_DRY:-}" ]; then echo "${keep[*]}"; else "${keep[@]}" || failed=1; fi
exit $failed

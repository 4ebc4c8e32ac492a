#!/usr/bin/env bash
# A speed change measured as docs/performance.md's rule asks (a benchmark, not a test):
#   bash ci/gpu_ab.sh OUT LABEL PAIRS "A ARGS" "B ARGS"
# Runs `python -m harness bench` on the TE matrix with the pytest arguments A (without the
# change) and B (with it, e.g. "--accelerations all" against "--accelerations all,-NAME", or
# an environment variable as VAR=VALUE first): one warm-up run of A (a fresh machine's caches,
# not judged), then PAIRS pairs in the order A B B A A B ... (a machine that speeds up or slows
# down over the call favours neither side), then `python -m harness ab` on them (exit 0: the
# change gains >= 10% with the same outcomes). A ARGS / B ARGS are split on whitespace;
# "--max-world-size 2" in both runs the 2-rank half. OUT gets LABEL-warmup.json,
# LABEL-a1.json, LABEL-b1.json, ... and LABEL-ab.txt. Each run is bounded by STEP_S seconds
# (default 300). PYTHON (default python3); BENCH_DRY=1 prints the commands instead.
set -uo pipefail
out=$(mkdir -p "${1:?usage: bash ci/gpu_ab.sh OUT LABEL PAIRS 'A ARGS' 'B ARGS'}" && cd "$1" && pwd)
label=${2:?label} pairs=${3:?pairs} a_args=${4-} b_args=${5-}
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

source ci/bench_lib.sh
run() {  # run NAME ARGS: one bench of the TE matrix, ARGS split on whitespace
  local args=()
  read -r -a args <<< "$2"
  bench_te "$1" ${args[@]+"${args[@]}"}
}

run warmup "$a_args"
a=() b=()
for ((i = 1; i <= pairs; i++)); do
  if ((i % 2)); then order=(a b); else order=(b a); fi
  for side in "${order[@]}"; do
    if [ "$side" = a ]; then run "a$i" "$a_args"; a+=("$out/$label-a$i.json")
    else run "b$i" "$b_args"; b+=("$out/$label-b$i.json"); fi
  done
done
judge=("$py" -m harness ab --a "${a[@]}" --b "${b[@]}")
if [ -n "${BENCH_DRY:-}" ]; then echo "${judge[*]}"; exit 0; fi
"${judge[@]}" | tee "$out/$label-ab.txt"
exit "${PIPESTATUS[0]}"

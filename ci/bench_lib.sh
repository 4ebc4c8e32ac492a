# Sourced by ci/gpu_bench.sh and ci/gpu_ab.sh: one bench of the TE matrix.
#   bench_te NAME [VAR=VALUE...] PYTEST-ARGS...
# runs `python -m harness bench` labelled "$label-NAME" into "$out" (both the caller's), the
# leading VAR=VALUE words its environment, bounded by STEP_S seconds (default 300), with
# "$py"; where the caller set "$stores", its results store is "$stores/NAME" (kept after it).
# BENCH_DRY=1 prints the command instead. Returns the bench's status.
bench_te() {
  local name=$1 envs=() store=()
  shift
  while [[ "${1:-}" == *=* && "${1:-}" != -* ]]; do envs+=("$1"); shift; done
  if [ -n "${stores:-}" ]; then store=(--report-dir "$stores/$name"); fi
  local cmd=(env ${envs[@]+"${envs[@]}"} timeout "${STEP_S:-300}" "$py" -m harness bench
             --label "$label-$name" --out "$out" --force -- -p harness.plugin
             --scenario fsdp2_tp_dcp --backend te ${store[@]+"${store[@]}"} "$@")
  if [ -n "${BENCH_DRY:-}" ]; then echo "${cmd[*]}"; return 0; fi
  echo "=== $label-$name"
  "${cmd[@]}"
}

#!/usr/bin/env bash
# usage: bash ci/side_by_side.sh 'COMMAND' 'COMMAND' ...
# Runs the commands at once, each to a log of its own; once all have ended, shows the logs in
# the order given and exits 1 if any command failed. If this script is stopped, so are they.
set -uo pipefail
logs=$(mktemp -d)
pids=()
stop() {
  for p in ${pids[@]+"${pids[@]}"}; do
    pkill -TERM -P "$p" 2>/dev/null || true  # the command's own process (pytest), then its shell
    kill -- "$p" 2>/dev/null || true
  done
  rm -rf "$logs"
}
trap stop EXIT
trap 'exit 143' TERM INT
i=0
for cmd in "$@"; do
  bash -c "$cmd" > "$logs/$i.log" 2>&1 &
  pids+=($!)
  i=$((i + 1))
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
pids=()
for ((j = 0; j < i; j++)); do cat "$logs/$j.log"; done
[ "$failed" = 0 ] || { echo "side_by_side: a command failed (its log above)"; exit 1; }

#!/usr/bin/env bash
# The kill test: SIGKILL a process that saves checkpoints back to back (save_loop) at random moments, N times in
# the same folder; after each kill the newest complete checkpoint must load, pass its checksum and hold what it
# should (save_loop --verify). Prints how many kills landed inside a save (its temporary file left behind).
#
#   bash tests/checkpoint/kill_test.sh build/tests/checkpoint/save_loop [N=50]
set -uo pipefail
bin=$1
n=${2:-50}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export SB_SAVE_LOOP_FLOATS=${SB_SAVE_LOOP_FLOATS:-262144}
RANDOM=$$
mid_save=0
verified=0
for i in $(seq 1 "$n"); do
  "$bin" "$dir" &
  pid=$!
  # 20 to 420 ms: past start-up (a few ms) into the saves, a different moment of one each time.
  sleep "0.$(printf '%03d' $((20 + RANDOM % 400)))"
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if compgen -G "$dir/.step-*.tmp.*" >/dev/null; then mid_save=$((mid_save + 1)); fi
  if ! out=$("$bin" "$dir" --verify 2>&1); then
    echo "kill $i: the newest checkpoint does not load whole:"
    echo "$out"
    exit 1
  fi
  case "$out" in *whole*) verified=$((verified + 1)) ;; esac
done
echo "kills $n, inside a save $mid_save, newest checkpoint loaded whole and right after $verified (none yet after the others)"
# Every kill after the first save must leave a loadable checkpoint; most kills must find one to check.
if [ "$verified" -lt $((n / 2)) ]; then
  echo "too few kills found a checkpoint to check ($verified of $n): the test checked too little"
  exit 1
fi

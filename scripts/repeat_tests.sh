#!/usr/bin/env bash
# Runs the Release suite N times in a row (default 20) under `ctest -j2` while a third process keeps one core busy,
# and stops at the first failure: the check that no test depends on which device runs which chunk, or on timing
# under load.
#
#   bash scripts/repeat_tests.sh [RUNS] [BUILD_DIR] [CTEST_ARGS...]   (build/ configured as scripts/test.sh does)
#   bash scripts/repeat_tests.sh 20 build -L "checkpoint|torch"       (some labels only)
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
build=${2:-build}
shift $(( $# < 2 ? $# : 2 ))
[ -f "$build/CTestTestfile.cmake" ] || { echo "repeat_tests: no CTest build in $build (run scripts/test.sh or configure it first)"; exit 2; }
# The load: one busy process for the whole run, stopped on any exit.
( while :; do :; done ) &
load=$!
trap 'kill "$load" 2>/dev/null' EXIT
start=$SECONDS
for i in $(seq "$runs"); do
  if ! (cd "$build" && ctest -j2 --output-on-failure "$@" > "ctest-repeat-$i.log" 2>&1); then
    echo "repeat_tests: run $i of $runs FAILED after $((SECONDS - start)) s; its log: $build/ctest-repeat-$i.log"
    grep -E "\*\*\*Failed|\(Failed\)|Timeout" "$build/ctest-repeat-$i.log" | head -20
    exit 1
  fi
  echo "repeat_tests: run $i of $runs passed ($(grep -E 'tests passed' "$build/ctest-repeat-$i.log")) at $((SECONDS - start)) s"
  rm -f "$build/ctest-repeat-$i.log"
done
echo "repeat_tests: all $runs runs passed in $((SECONDS - start)) s, one core kept busy throughout"

#!/usr/bin/env bash
# Runs the Release suite N times in a row (default 20) and stops at the first failure: the check that no test
# depends on which device runs which chunk, or on timing under load. Each run has two passes: every test but the
# `perf`-labelled ones under `ctest -j2` while a third process keeps one core busy, then the `perf` cases (those
# that time the wall clock: step times, latencies, a deadline) one at a time with the load stopped.
#
#   bash scripts/repeat_tests.sh [RUNS] [BUILD_DIR] [CTEST_ARGS...]   (build/ configured as scripts/test.sh does)
#   bash scripts/repeat_tests.sh 20 build -L "checkpoint|torch"       (some labels only)
#
# Exit status: 0 when every run passed (and for --help); 1 at the first failure; 2 for a bad RUNS or BUILD_DIR.
set -uo pipefail
usage() { sed -n '7,8p' "$0" | sed 's/^# \{0,1\}//'; }
case ${1:-} in -h | --help) usage; exit 0 ;; esac
cd "$(dirname "$0")/.."
runs=${1:-20}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "repeat_tests: RUNS '$runs': give a whole number, 1 or more" >&2; usage >&2; exit 2; }
build=${2:-build}
shift $(( $# < 2 ? $# : 2 ))
[ -f "$build/CTestTestfile.cmake" ] || { echo "repeat_tests: no CTest build in $build (run scripts/test.sh or configure it first)"; exit 2; }
# The load: one busy process for each loaded pass, stopped after it and on any exit.
load=
start_load() { ( while :; do :; done ) & load=$!; }
stop_load() { [ -n "$load" ] && kill "$load" 2>/dev/null && wait "$load" 2>/dev/null; load=; }
trap stop_load EXIT
pass() {  # run, what, ctest args...: 0 if the pass passed
  local i=$1 what=$2 log="ctest-repeat-$1-$2.log"
  shift 2
  if ! (cd "$build" && ctest --output-on-failure "$@" > "$log" 2>&1); then
    echo "repeat_tests: run $i of $runs FAILED ($what) after $((SECONDS - start)) s; its log: $build/$log"
    grep -E "\*\*\*Failed|\(Failed\)|Timeout" "$build/$log" | head -20
    return 1
  fi
  echo "repeat_tests: run $i of $runs, $what passed ($(grep -E 'tests passed|No tests were found' "$build/$log")) at $((SECONDS - start)) s"
  rm -f "$build/$log"
}
start=$SECONDS
for i in $(seq "$runs"); do
  start_load
  pass "$i" loaded -j2 -LE perf "$@" || exit 1
  stop_load
  pass "$i" perf -L perf "$@" || exit 1
done
echo "repeat_tests: all $runs runs passed in $((SECONDS - start)) s, one core kept busy for all but the perf cases"

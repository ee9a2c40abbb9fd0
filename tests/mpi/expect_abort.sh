#!/usr/bin/env bash
# expect_abort.sh CASE PROGRAM MPIRUN...: runs PROGRAM CASE on 3 ranks, which must end the whole job: a non-zero exit
# status, the message that names what happened, and within the bound (20 s: see below).
set -u
case_name=$1 program=$2
shift 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s.%N)
timeout 50 "$@" -np 3 "$program" "$case_name" >"$log" 2>&1
rc=$?
end=$(date +%s.%N)
cat "$log"
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
echo "expect_abort: case $case_name, exit status $rc, $elapsed s"
case $case_name in
  stall) want='rank 1: device sim0 made no progress for [0-9]+ ms in step 2 \(stuck in chunk' ;;
  hang) want='rank 1 \(node [^)]+\) stopped answering: no heartbeat for [0-9]+ ms \(heartbeat_timeout = 1 s.*last seen in step 3, in chunk [0-9]+ on its device 0' ;;
  absent) want='rank 1 \(node [^)]+\) made no progress for [0-9]+ ms while this rank is in step 3; last seen in step 2.*not calling step\(\) with the others' ;;
  wedged-node) want="node group1 \\(rank 2\\) stopped answering: rank [01] \\(node group0\\)'s access to .* while every rank of node group0 goes on" ;;
  wedged-neighbour) want='rank 2 \(node [^)]+\) stopped answering: its pulse on the node has stood still for [0-9]+ ms' ;;
  die) want='exited|terminated|killed|exit code|non-zero status' ;;
  *) echo "expect_abort: unknown case $case_name"; exit 2 ;;
esac
# The bound tells the timeout under test (1 s, plus 1 s after the stall starts, plus starting 3 ranks and 2 steps:
# about 3 s) from every other way the job could end: the other timeout (60 s), the absent rank's 30 s sleep, or
# `timeout 50`. At 20 s a loaded machine, which adds seconds at most to the start-up, cannot reach it.
bound=20
status=0
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then echo "expect_abort: FAILED: the job did not end on its own with an error (status $rc)"; status=1; fi
if ! grep -Eq "$want" "$log"; then echo "expect_abort: FAILED: no line matches /$want/"; status=1; fi
if awk -v e="$elapsed" -v b="$bound" 'BEGIN { exit !(e > b) }'; then echo "expect_abort: FAILED: took $elapsed s, bound $bound s"; status=1; fi
[ $status -eq 0 ] && echo "expect_abort: PASSED"
exit $status

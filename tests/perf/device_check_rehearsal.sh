#!/usr/bin/env bash
# The device check's time keeping, rehearsed without a GPU: a pack of stand-in binaries in which one GPU test hangs.
# The run must cut that step at the deadline, skip every later step with a line that says so, still print the
# summary naming each missing figure, write device_check.json, and exit non-zero, all within the deadline; and a run
# stopped by SIGTERM must print its summary at once.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/pack/bin" "$WORK/pack/lib" "$WORK/pack/data"
for b in test_cuda_basics mlp cnn stealbench; do printf '#!/bin/sh\necho "%s: no GPU here"\nexit 1\n' "$b" > "$WORK/pack/bin/$b"; done
printf '#!/bin/sh\necho "test_cuda_runtime: hangs"\nexec sleep 1017\n' > "$WORK/pack/bin/test_cuda_runtime"
printf '#!/bin/sh\nexit 2\n' > "$WORK/pack/bin/gpu_check"
chmod +x "$WORK/pack/bin/"*
fail() { echo "rehearsal: FAIL: $*"; sed 's/^/  | /' "$WORK/out/device_check.log" 2>/dev/null | tail -60; exit 1; }

# The log's tee may still be writing its last lines when the script exits: wait for its final line (10 s at most).
wait_for_log() { for _ in $(seq 100); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.1; done; return 1; }

start=$(date +%s)
OUT="$WORK/out" DEVICE_CHECK_DEADLINE_S=12 DEVICE_CHECK_MIN_STEP_S=2 bash "$REPO/perf/device_check.sh" "$WORK/pack" > "$WORK/stdout" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
log="$WORK/out/device_check.log"
wait_for_log "] done:" "$log"
echo "rehearsal: device_check.sh exited $rc after $took s (deadline 12 s)"
[ $rc -ne 0 ] || fail "exit status 0 although every step failed"
[ $took -le 30 ] || fail "took $took s: the deadline did not hold"
grep -q "test_cuda_runtime timed out" "$log" || fail "the hanging step was not cut at the deadline"
for s in gpu_check torch_ref mlp_cuda mlp_vgpu cnn_cuda ckpt_gpu_cpu ckpt_cpu_gpu ckpt_straight torch_build torch_gpu_check stealbench16 stealbench32; do
  grep -q "SKIPPED $s:" "$log" || fail "step $s was neither run nor reported as skipped"
done
grep -q "== \[ *[0-9]*s\] summary" "$log" || fail "no summary"
for row in "mlp GPU vs CPU gradient" "cnn GPU vs CPU gradient" "mlp samples/s vs PyTorch" "vgpu static/steal/ideal" "allreduce" \
           "mlp example on cuda:0" "cnn example on cuda:0" "checkpoint cuda:0 -> cpu:2" "torch_mlp adapter on cuda:0" "torch_cnn adapter on cuda:0" \
           "stealbench 16 devices" "stealbench 32 devices" "step test_cuda_basics"; do
  grep "$row" "$log" | grep -q -E "missing|exit|skipped" || fail "the summary does not name '$row' as missing"
done
[ -s "$WORK/out/device_check.json" ] || fail "no device_check.json"

# A run killed from outside (SIGTERM, as a command limit would) still prints its summary, at once.
rm -rf "$WORK/out"
OUT="$WORK/out" DEVICE_CHECK_DEADLINE_S=120 bash "$REPO/perf/device_check.sh" "$WORK/pack" > "$WORK/stdout" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "test_cuda_runtime: hangs" "$WORK/out/device_check.log" 2>/dev/null && break; sleep 0.1; done
start=$(date +%s)
kill -TERM "$pid"
wait "$pid"
rc=$?
took=$(( $(date +%s) - start ))
wait_for_log "] done:" "$WORK/out/device_check.log"
echo "rehearsal: after SIGTERM, device_check.sh exited $rc in $took s"
[ $rc -ne 0 ] || fail "exit status 0 after SIGTERM"
[ $took -le 5 ] || fail "took $took s to stop after SIGTERM"
grep -q "interrupted by SIGTERM" "$WORK/out/device_check.log" || fail "no line for the signal"
grep -q "mlp GPU vs CPU gradient *missing" "$WORK/out/device_check.log" || fail "no summary after SIGTERM"

# A limit that signals the whole process group (as `timeout` and the device tool do) takes the log's tee along too:
# the summary must still reach the log.
rm -rf "$WORK/out"
OUT="$WORK/out" DEVICE_CHECK_DEADLINE_S=120 setsid bash "$REPO/perf/device_check.sh" "$WORK/pack" > "$WORK/stdout" 2>&1 &
leader=$!
for _ in $(seq 100); do grep -q "test_cuda_runtime: hangs" "$WORK/out/device_check.log" 2>/dev/null && break; sleep 0.1; done
kill -TERM -- "-$leader" 2>/dev/null
wait "$leader" 2>/dev/null
wait_for_log "] done:" "$WORK/out/device_check.log" || fail "no summary after SIGTERM to the process group"
grep -q "mlp GPU vs CPU gradient *missing" "$WORK/out/device_check.log" || fail "the summary lacks its rows after a group SIGTERM"
echo "rehearsal: after SIGTERM to the whole process group, the summary is in the log"

# The hanging stand-in must not outlive the runs.
for _ in $(seq 50); do pgrep -x -f "sleep 1017" >/dev/null || break; sleep 0.1; done
if pgrep -x -f "sleep 1017" >/dev/null; then
  pkill -x -f "sleep 1017"
  fail "the hanging step outlived the script"
fi
echo "rehearsal: PASS"

#!/usr/bin/env bash
# elastic.sh MLP [EPOCHS LIMIT BAR]: scripts/launch.sh runs the MLP on 3 emulated nodes (one rank each) with a checkpoint
# every 5 steps; once the first checkpoint is written, sbn2's link is cut. The job must end naming sbn2, the launcher
# must run it again on sbn0 and sbn1 from the newest checkpoint, and that run must reach its last epoch with a test
# accuracy of at least BAR. Prints the time from the cut to the first step on the survivors, and the steps run again.
# In deterministic mode (--deterministic), the survivors' final parameters must then be the bytes that a run resumed
# from the same checkpoint on the same two nodes, with no failure, ends with (the "parameters sha256" lines).
# Defaults (4 epochs of 12,000 samples, bar 0.80) keep it near a minute; perf/sections/cluster.sh runs the full MLP.
# Exits 77 (skipped) where the machine cannot make namespaces; bounded, and the cluster is torn down on any exit.
set -u
mlp=$1 epochs=${2:-4} limit=${3:-12000} bar=${4:-0.80}
here=$(cd "$(dirname "$0")" && pwd)
scripts="$here/../../scripts"
log=$(mktemp) save=$(mktemp -d)
trap 'bash "$scripts/cluster.sh" down >/dev/null 2>&1; rm -rf "$log" "$save"' EXIT

bash "$scripts/cluster.sh" up 3
rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "elastic: the cluster did not come up (status $rc)"; exit 1; }

timeout 300 bash "$scripts/launch.sh" --nodes sbn0,sbn1,sbn2 --save "$save" --save-every 5 --min-nodes 2 -- \
  "$mlp" --devices cpu:1 --limit "$limit" --batch 512 --epochs "$epochs" --heartbeat-timeout 2 --deterministic --keep 1000 >"$log" 2>&1 &
job=$!
for _ in $(seq 1200); do
  ls "$save"/step-*.safetensors >/dev/null 2>&1 && break
  kill -0 $job 2>/dev/null || break
  sleep 0.05
done
ls "$save"/step-*.safetensors >/dev/null 2>&1 || { cat "$log"; echo "elastic: no checkpoint within 60 s"; exit 1; }
cut_at=$(date +%s.%N)
bash "$scripts/cluster.sh" cut sbn2
wait $job
rc=$?
cat "$log"

status=0
[ $rc -eq 0 ] || { echo "elastic: FAILED: the launcher exited $rc"; status=1; }
grep -q "launch: .* lost sbn2; 2 nodes remain (sbn0 sbn1)" "$log" || { echo "elastic: FAILED: the launcher did not drop sbn2"; status=1; }
grep -q "starting on 2 nodes (sbn0 sbn1), 1 ranks each, resuming from" "$log" || { echo "elastic: FAILED: no relaunch from a checkpoint"; status=1; }
first=$(sed -n 's/^# first step after resuming: step \([0-9]*\) done at unix time \([0-9.]*\)$/\1 \2/p' "$log" | tail -1)
resumed=$(sed -n 's/^# resumed from .*step \([0-9]*\) (loaded.*/\1/p' "$log" | tail -1)
acc=$(sed -n 's/^test accuracy \([0-9.]*\)$/\1/p' "$log" | tail -1)
last_epoch=$(grep -c "epoch $epochs/$epochs .* samples/s" "$log")
if [ -n "$first" ] && [ -n "$resumed" ]; then
  echo "elastic: from the cut to the first step on the survivors: $(awk -v a="$cut_at" -v b="${first#* }" 'BEGIN { printf "%.2f", b - a }') s;" \
    "resumed at step $resumed (checkpoints every 5 steps: at most 4 steps run again, and those in flight at the cut)"
else
  echo "elastic: FAILED: no resumed run's first step"; status=1
fi
[ "$last_epoch" -ge 1 ] || { echo "elastic: FAILED: the run did not reach epoch $epochs"; status=1; }
awk -v a="${acc:-0}" -v b="$bar" 'BEGIN { exit !(a >= b) }' || { echo "elastic: FAILED: test accuracy ${acc:-none} below $bar"; status=1; }
# The same checkpoint, resumed on the same two nodes with nothing failing: the same parameters, bit for bit.
from=$(sed -n 's/^launch: .* resuming from \(.*\)$/\1/p' "$log" | tail -1)
if [ -n "$from" ] && [ -f "$from" ]; then
  again=$(mktemp -d)
  cp "$from" "$again/"
  ours=$(sed -n 's/^parameters sha256 \([0-9a-f]*\).*/\1/p' "$log" | tail -1)
  theirs=$(bash "$scripts/cluster.sh" run --hosts sbn0:1,sbn1:1 --timeout 120 -- "$mlp" --devices cpu:1 --limit "$limit" --batch 512 \
    --epochs "$epochs" --heartbeat-timeout 2 --deterministic --resume "$again" 2>&1 | sed -n 's/^parameters sha256 \([0-9a-f]*\).*/\1/p' | tail -1)
  rm -rf "$again"
  echo "elastic: parameters after the elastic run ${ours:-none}, after a straight resume from $(basename "$from") ${theirs:-none}"
  [ -n "$ours" ] && [ "$ours" = "$theirs" ] || { echo "elastic: FAILED: the parameters differ"; status=1; }
else
  echo "elastic: FAILED: the checkpoint resumed from (${from:-none}) is gone"; status=1
fi
[ $status -eq 0 ] && echo "elastic: PASSED (test accuracy $acc, bar $bar)"
exit $status

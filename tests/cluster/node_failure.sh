#!/usr/bin/env bash
# node_failure.sh CASE MLP: the MLP example on 2 emulated nodes x 2 ranks (scripts/cluster.sh), and a node that fails
# mid-run. CASE:
#   cut     sbn1's link drops every packet      the job ends, naming sbn1 and one of its ranks, within the bound
#   kill    every rank of sbn1 killed at once    the same (Open MPI's daemon on sbn1 lives on and reports them)
#   freeze  every rank of sbn1 stopped (SIGSTOP) the same
#   slow    sbn1's link cut to 20 Mbit/s         the job goes on to its end (exit 0)
#   slowcpu sbn1 capped at 20% of its core       the job goes on, and sbn1's rank runs under 40% of the samples
#           (one rank a node, 3 epochs of the full set; about a third at full speed, then a sixth: ~28% expected)
#   none    nothing happens                      the job ends (exit 0): the baseline of the others
# Exits 77 (CTest: skipped) where the machine cannot make namespaces, with the reason. Bounded: every wait has a limit,
# and the cluster is torn down on any exit.
set -u
case_name=$1 mlp=$2
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/../../scripts/cluster.sh"
log=$(mktemp)
trap 'bash "$cluster" down >/dev/null 2>&1; rm -f "$log"' EXIT
heartbeat=2

bash "$cluster" up 2
rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "node_failure: the cluster did not come up (status $rc)"; exit 1; }

# Long enough that the failure lands mid-run (about 20 s on 2 cores when nothing fails); the slow case runs 2 epochs.
epochs=40 ppn=2 data=(--limit 6000 --batch 256)
[ "$case_name" = slow ] || [ "$case_name" = none ] && epochs=2
[ "$case_name" = slowcpu ] && epochs=3 ppn=1 data=(--batch 1024)
bash "$cluster" run --ranks-per-node $ppn --timeout 150 -- "$mlp" --devices cpu:1 "${data[@]}" --epochs $epochs \
  --heartbeat-timeout $heartbeat >"$log" 2>&1 &
job=$!

# The failure once every rank has finished a step: the first progress line, at the first epoch's end.
for _ in $(seq 600); do
  grep -q "epoch 1/" "$log" && break
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
if ! grep -q "epoch 1/" "$log"; then
  cat "$log"
  echo "node_failure: the job did not finish its first epoch within 60 s"
  exit 1
fi

hit=$(date +%s.%N)
case $case_name in
  cut) bash "$cluster" cut sbn1 ;;
  kill) bash "$cluster" signal sbn1 KILL mlp ;;
  freeze) bash "$cluster" signal sbn1 STOP mlp ;;
  slow) bash "$cluster" rate sbn1 20mbit ;;
  slowcpu) bash "$cluster" cpu sbn1 0.2 ;;
  none) ;;
  *) echo "node_failure: unknown case $case_name"; exit 2 ;;
esac
wait $job
rc=$?
end=$(date +%s.%N)
cat "$log"
elapsed=$(awk -v a="$hit" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
echo "node_failure: case $case_name, exit status $rc, $elapsed s from the failure to the job's end"

status=0
if [ "$case_name" = slow ] || [ "$case_name" = none ] || [ "$case_name" = slowcpu ]; then
  [ $rc -eq 0 ] || { echo "node_failure: FAILED: the job should have ended normally (status $rc)"; status=1; }
  grep -q "samples/s" "$log" || { echo "node_failure: FAILED: no report"; status=1; }
  if [ "$case_name" = slowcpu ]; then
    # The dashboard's rows: samples is the second field from the end.
    share=$(awk '$2 == "r0/cpu0" { a = $(NF - 1) } $2 == "r1/cpu0" { b = $(NF - 1) } END { if (a + b > 0) printf "%.3f", b / (a + b) }' "$log")
    echo "node_failure: sbn1's rank ran ${share:-?} of the samples"
    awk -v s="${share:-1}" 'BEGIN { exit !(s < 0.40) }' || { echo "node_failure: FAILED: the stealing did not move work off the slow node (share ${share:-none}, bound 0.40)"; status=1; }
  fi
else
  # The bound: the heartbeat timeout (2 s), plus the heartbeat's period and Open MPI tearing the job down across
  # the nodes. The `run` limit (150 s) and any hang are far above it.
  bound=$((heartbeat + 13))
  case $case_name in
    kill) want='(rank [23].*(node )?sbn1|sbn1.*rank [23])' ;;
    # A rank of sbn1 named, or, where sbn0's windows are held by one of sbn1's ranks (the heartbeats then read
    # nobody), sbn1 itself with its ranks.
    *) want='(rank [23] \(node sbn1\)|node sbn1 \(ranks 2-3\)) stopped answering' ;;
  esac
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "node_failure: FAILED: the job did not end on its own with an error (status $rc)"; status=1; fi
  grep -Eq "$want" "$log" || { echo "node_failure: FAILED: no line names sbn1 and its rank (/$want/)"; status=1; }
  awk -v e="$elapsed" -v b="$bound" 'BEGIN { exit !(e > b) }' && { echo "node_failure: FAILED: took $elapsed s, bound $bound s"; status=1; }
fi
[ $status -eq 0 ] && echo "node_failure: PASSED"
exit $status

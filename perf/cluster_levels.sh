#!/usr/bin/env bash
# cluster_levels.sh BUILD [NODES...]: the gradient's sum across emulated nodes of 2 ranks each (scripts/cluster.sh,
# 1 Gbit/s, 50 us one way): MPI's own allreduce, the ring in node order and two levels (STEALBATCH_MPI_RING 0, 1, 2),
# interleaved, 2 rounds. First the sum alone (perf/reducebench: 5.8M values, float32 and bf16) with the bytes node 0
# sent over the run; then at the largest node count the wide MLP (one rank of cpu:1 each, 3 epochs) with each, its
# reduction phase ("allreduce" in the dashboard) and epoch time. Needs root; the cluster is torn down at the end.
set -uo pipefail
build=$1
shift
[ $# -gt 0 ] && nodes=("$@") || nodes=(2 4)
cl="bash scripts/cluster.sh"
trap '$cl down >/dev/null 2>&1' EXIT
sent() { $cl exec sbn0 cat /sys/class/net/eth0/statistics/tx_bytes; }
last=${nodes[$((${#nodes[@]} - 1))]}
for k in "${nodes[@]}"; do
  $cl up "$k" --delay-us 50 --rate 1gbit >/dev/null || exit $?
  for round in 1 2; do
    for how in 0 1 2; do
      before=$(sent)
      out=$($cl run --ranks-per-node 2 --timeout 300 -- -x STEALBATCH_MPI_RING=$how "$build/perf/reducebench" 2>&1 | grep reducebench)
      after=$(sent)
      echo "$out" | sed "s/^/$k nodes x 2 round $round: /"
      echo "$k nodes x 2 round $round: STEALBATCH_MPI_RING=$how: node 0 sent $(( (after - before) / 1000000 )) MB"
    done
  done
  [ "$k" = "$last" ] || continue
  for round in 1 2; do
    for how in 0 1 2; do
      line=$($cl run --ranks-per-node 2 --timeout 600 -- -x STEALBATCH_MPI_RING=$how "$build/examples/mlp" --devices cpu:1 --hidden 2048,2048 --limit 2048 \
               --batch 256 --epochs 3 2>&1 | grep -E "time: chunks|epoch time" | tr '\n' ' ')
      echo "$k nodes x 2 round $round wide mlp STEALBATCH_MPI_RING=$how: $line"
    done
  done
done

#!/usr/bin/env bash
# cluster_wire.sh BUILD [NODES...]: the gradient's sum across emulated nodes (scripts/cluster.sh, one rank of one CPU
# device a node, a one-way delay of 50 us) at 1 and 10 Gbit/s, on the wide MLP (784-2048-2048-10: 5.8M parameters,
# 23 MB of float gradient): float32 against bf16 on the wire, each by the runtime's pipelined ring and by MPI's own
# allreduce (STEALBATCH_MPI_RING=0), interleaved. Prints each run's reduction time ("allreduce" in the dashboard: the
# devices' sum within the rank, then across ranks), its epoch time and its last loss, and the bytes node 0 sent (its
# link's counter) over the run; before them, the sum alone (perf/reducebench: the same 5.8M values, float32 and bf16,
# ring and MPI's). Needs root; the cluster is torn down at the end.
set -uo pipefail
build=$1
shift
[ $# -gt 0 ] && nodes=("$@") || nodes=(2 4)
cl="bash scripts/cluster.sh"
trap '$cl down >/dev/null 2>&1' EXIT
sent() { $cl exec sbn0 cat /sys/class/net/eth0/statistics/tx_bytes; }
for k in "${nodes[@]}"; do
  for rate in 1gbit 10gbit; do
    $cl up "$k" --delay-us 50 --rate "$rate" >/dev/null || exit $?
    for ring in 1 0; do
      $cl run --ranks-per-node 1 --timeout 300 -- -x STEALBATCH_MPI_RING=$ring "$build/perf/reducebench" 2>&1 | grep reducebench | sed "s/^/$k nodes $rate: /"
    done
    for round in 1 2; do
      for run in "mpi float32" "ring float32" "mpi bf16" "ring bf16"; do
        read -r sum wire <<< "$run"
        [ "$sum" = ring ] && ring=1 || ring=0
        before=$(sent)
        line=$($cl run --ranks-per-node 1 --timeout 600 -- -x STEALBATCH_MPI_RING=$ring "$build/examples/mlp" --devices cpu:1 --hidden 2048,2048 --limit 2048 --batch 256 \
                 --epochs 3 --schedule constant --wire "$wire" 2>&1 | grep -E "time: chunks|epoch time|loss [0-9]" | tr '\n' ' ')
        after=$(sent)
        reduce=$(echo "$line" | sed -n 's/.*allreduce \([0-9.]*\) s.*/\1/p')
        epoch=$(echo "$line" | sed -n 's/.*epoch time \([0-9.]*\) s.*/\1/p')
        loss=$(echo "$line" | grep -o 'loss [0-9.]*' | tail -1)
        echo "$k nodes $rate round $round $sum $wire: allreduce $reduce s, epoch $epoch s, $loss, node 0 sent $(( (after - before) / 1000000 )) MB"
      done
    done
  done
done

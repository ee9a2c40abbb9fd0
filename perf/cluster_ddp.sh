#!/usr/bin/env bash
# cluster_ddp.sh BUILD NODES RATE SLOWDOWN [ROUNDS]: the wide MLP (784-2048-2048-10, a 23 MB float gradient) on NODES
# emulated nodes (scripts/cluster.sh, one rank of one CPU device a node, 50 us one way, RATE on each link), the
# devices slowed by SLOWDOWN (one factor a node, e.g. 6.6,1,1,1), against PyTorch DDP (gloo, its bucketed allreduce
# overlapped with the backward pass) launched into the same namespaces with the same slowdown: stealbatch with
# float32 and bf16 on the wire, DDP plain and with bf16_compress_hook, interleaved, ROUNDS rounds (3). Prints each
# run's samples/s, the median epoch after the first as torch_ref.py reports DDP's (stealbatch's dashboard beside it),
# and test accuracy. Needs root and TORCH_PYTHON (a Python with
# torch: PyTorch is a peer, never a dependency); the cluster is torn down at the end.
set -uo pipefail
build=$1 nodes=$2 rate=$3 slowdown=$4 rounds=${5:-3}
: "${TORCH_PYTHON:?set TORCH_PYTHON to a Python with torch}"
cl="bash scripts/cluster.sh"
trap '$cl down >/dev/null 2>&1' EXIT
$cl up "$nodes" --delay-us 50 --rate "$rate" >/dev/null || exit $?
limit=2048
data=(--limit $limit --batch 256 --epochs 3)
ddp() {  # ddp ROUND [--bf16-hook]
  local r
  for ((r = 1; r < nodes; r++)); do
    $cl exec "sbn$r" env GLOO_SOCKET_IFNAME=eth0 "$TORCH_PYTHON" perf/torch_ref.py ddp --model mlp --hidden 2048,2048 --procs "$nodes" --rank "$r" \
      --master 10.77.0.10:29511 --slowdown "$slowdown" "${data[@]}" --json /dev/null "${@:2}" >/dev/null 2>&1 &
  done
  echo "round $1 DDP${2:+ $2}: $($cl exec sbn0 env GLOO_SOCKET_IFNAME=eth0 "$TORCH_PYTHON" perf/torch_ref.py ddp --model mlp --hidden 2048,2048 \
    --procs "$nodes" --rank 0 --master 10.77.0.10:29511 --slowdown "$slowdown" "${data[@]}" --json /dev/null "${@:2}" 2>&1 | grep "samples/s (median")"
  wait
}
echo "## wide mlp, $nodes nodes x cpu:1, slowdown $slowdown, one-way delay 50 us, $rate"
for ((i = 1; i <= rounds; i++)); do
  for wire in float32 bf16; do
    out=$($cl run --ranks-per-node 1 --timeout 600 -- "$build/examples/mlp" --devices cpu:1 --hidden 2048,2048 \
      --slowdown "$slowdown" --wire "$wire" "${data[@]}" 2>&1)
    # The epochs after the first: the samples over their median time, as torch_ref.py reads DDP's (statistics.median:
    # the mean of the middle two of an even count).
    after=$(echo "$out" | grep -a "epoch [0-9]*/" | tail -n +2 | grep -o '[0-9]* samples/s' | cut -d' ' -f1 | sort -n)
    med=$(echo "$after" | awk -v n="$limit" '{t[NR] = n / $1} END {m = NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2; printf "%.0f", n / m}')
    echo "round $i stealbatch $wire: $med samples/s (median epoch after the first) $(echo "$out" | grep -E "epoch time|time: chunks" | tr '\n' ' ')"
  done
  ddp "$i"
  ddp "$i" --bf16-hook
done

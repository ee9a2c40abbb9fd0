# cluster: across emulated nodes (scripts/cluster.sh: network namespaces, one core each, a delay and a rate on each
# link), beside the same on one node: one remote steal at 0, 50 and 500 µs one-way; the reduction at 10 and 1 Gbit/s
# for the MLP and the CNN, and for the wide MLP the ring against MPI's allreduce and float32 against bf16 on the wire;
# stealbench on 2 nodes x 2 ranks x 2 devices; the main job on 2 nodes against DDP (gloo)
# launched into the same namespaces (TORCH_PYTHON); an elastic resume of the full MLP after a node is cut off. Needs
# root (namespaces); skipped with the reason otherwise.
section_cluster() {
  need_emulated_nodes
  local cl="bash scripts/cluster.sh" d rate model args steals
  link() { $cl exec sbn0 ping -q -c 50 -i 0.02 10.77.0.11 | sed -n 's/^rtt .* = \([0-9.]*\)\/\([0-9.]*\)\/\([0-9.]*\)\/.*/ping sbn0 -> sbn1: rtt min \1 ms, avg \2 ms, max \3 ms/p'; }

  # One steal across the link: read + compare-and-swap, each flushed, while the victim computes.
  {
    echo "## one node: 2 ranks, osc sm ($(machine))"
    "${mpi[@]}" -np 2 "$build/perf/dequebench" --remote --steals 20000
    for d in 0 50 500; do
      steals=$([ "$d" -ge 500 ] && echo 1000 || echo 5000)
      $cl up 2 --delay-us "$d" >/dev/null
      echo "## two nodes, one rank each, osc ucx over TCP with the progress agent; one-way delay $d us; $(link)"
      $cl run --ranks-per-node 1 --timeout 600 -- "$build/perf/dequebench" --remote --steals "$steals"
    done
  } 2>&1 | grep -v "UCX  \(ERROR\|WARN\)" | tee "$out/cluster_remote_steal.txt"

  # The reduction phase (the dashboard's allreduce: the devices' sum within the rank, then across ranks) per step.
  {
    for model in mlp cnn; do
      if [ $model = mlp ]; then args=(--limit 20000 --batch 1024 --epochs 3); else args=(--limit 4000 --batch 64 --epochs 1); fi
      echo "## $model, one node: 2 ranks x cpu:1, osc sm"
      "${mpi[@]}" -np 2 "$build/examples/$model" --devices cpu:1 "${args[@]}" 2>&1 | grep -E "^\+-- policy|time: chunks|epoch time"
      for rate in 10gbit 1gbit; do
        $cl up 2 --delay-us 50 --rate "$rate" >/dev/null
        echo "## $model, two nodes x 1 rank x cpu:1, one-way delay 50 us, $rate; $(link)"
        $cl run --ranks-per-node 1 --timeout 600 -- "$build/examples/$model" --devices cpu:1 "${args[@]}" 2>&1 | grep -E "^\+-- policy|time: chunks|epoch time"
      done
    done
  } | tee "$out/cluster_reduction.txt"

  # The gradient's sum on the wide MLP: the ring against MPI's allreduce, float32 against bf16 on the wire, 2 and 4
  # nodes, 1 and 10 Gbit/s (the wide MLP against DDP: the cluster_ddp section).
  bash perf/cluster_wire.sh "$build" 2 4 | tee "$out/cluster_wire.txt"

  # stealbench across 2 nodes x 2 ranks x 2 simulated devices, beside 4 ranks x 2 on one node.
  {
    echo "## one node: 4 ranks x 2 devices, osc sm"
    "${mpi[@]}" -np 4 "$build/perf/stealbench" --devices-per-rank 2 --scenario seed-slow,hetero,slowdown --policy static,steal-adaptive --steps 21 --batch 2048 2>/dev/null
    $cl up 2 --delay-us 50 --rate 10gbit >/dev/null
    echo "## two nodes x 2 ranks x 2 devices, one-way delay 50 us, 10gbit; $(link)"
    $cl run --ranks-per-node 2 --timeout 600 -- "$build/perf/stealbench" --devices-per-rank 2 --scenario seed-slow,hetero,slowdown \
      --policy static,steal-adaptive --steps 21 --batch 2048 2>/dev/null
    # One rank a node: each rank its node's core, as on real nodes (above, two ranks share each node's one core).
    echo "## one node: 2 ranks x 2 devices, osc sm"
    "${mpi[@]}" -np 2 "$build/perf/stealbench" --devices-per-rank 2 --scenario seed-slow,hetero,slowdown --policy static,steal-adaptive --steps 21 --batch 1024 2>/dev/null
    echo "## two nodes x 1 rank x 2 devices, one-way delay 50 us, 10gbit"
    $cl run --ranks-per-node 1 --timeout 600 -- "$build/perf/stealbench" --devices-per-rank 2 --scenario seed-slow,hetero,slowdown \
      --policy static,steal-adaptive --steps 21 --batch 1024 2>/dev/null
  } | tee "$out/cluster_stealbench.txt"

  # The main job on two nodes (one rank of one device each, the first 6.6x slow) against DDP in the same namespaces,
  # 3 interleaved rounds.
  if [ -n "${TORCH_PYTHON:-}" ]; then
    $cl up 2 --delay-us 50 --rate 10gbit >/dev/null
    {
      echo "## mlp 2 nodes x cpu:1, slowdown 6.6,1, 3 epochs, one-way delay 50 us, 10gbit; $(link)"
      for i in 1 2 3; do
        echo "round $i stealbatch: $($cl run --ranks-per-node 1 --timeout 600 -- "$build/examples/mlp" --devices cpu:1 --slowdown 6.6,1 --epochs 3 2>&1 | grep "epoch time")"
        $cl exec sbn1 env GLOO_SOCKET_IFNAME=eth0 "$TORCH_PYTHON" perf/torch_ref.py ddp --model mlp --procs 2 --rank 1 --master 10.77.0.10:29511 \
          --slowdown 6.6,1 --epochs 3 --json /dev/null >/dev/null 2>&1 &
        echo "round $i DDP: $($cl exec sbn0 env GLOO_SOCKET_IFNAME=eth0 "$TORCH_PYTHON" perf/torch_ref.py ddp --model mlp --procs 2 --rank 0 \
          --master 10.77.0.10:29511 --slowdown 6.6,1 --epochs 3 --json /dev/null 2>&1 | grep "samples/s (median")"
        wait
      done
    } | tee "$out/cluster_ddp.txt"
  else
    echo "the main job against DDP across nodes: skipped (set TORCH_PYTHON)"
  fi

  # Elastic resume: the full MLP (10 epochs of 60,000) on 3 nodes, one cut off after the first checkpoint, run again
  # on the survivors to its accuracy bar; deterministic, so its weights are those of a straight resume.
  bash tests/cluster/elastic.sh "$build/examples/mlp" 10 60000 0.88 | grep -E "^(launch|elastic):|^# (resumed|first step)|^stealbatch:" |
    tee "$out/cluster_elastic.txt"
}

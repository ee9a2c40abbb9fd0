# cluster_ddp: the wide MLP (a 23.3 MB gradient) against DDP (gloo, its buckets overlapped with the backward pass) on 4
# emulated nodes of one rank (scripts/cluster.sh), node 0 slowed 6.6x, at 1 and "10" Gbit/s: float32 and bf16 on both
# sides (perf/cluster_ddp.sh). Needs root (namespaces) and TORCH_PYTHON; skipped with the reason otherwise.
section_cluster_ddp() {
  [ -n "${TORCH_PYTHON:-}" ] || skip "set TORCH_PYTHON to a Python with torch (PyTorch is a peer, never a dependency)"
  need_emulated_nodes
  { echo "# $(machine)"; bash perf/cluster_ddp.sh "$build" 4 1gbit 6.6,1,1,1 3; } | tee "$out/cluster_ddp_wide.txt"
  { echo "# $(machine)"; bash perf/cluster_ddp.sh "$build" 4 10gbit 6.6,1,1,1 3; } | tee "$out/cluster_ddp_wide_10gbit.txt"
}

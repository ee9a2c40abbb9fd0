# cluster_sum: the gradient's sum where it is most of the step, across emulated nodes (scripts/cluster.sh): on nodes
# of 2 ranks each at 1 Gbit/s, MPI's allreduce, the ring in node order and two levels, interleaved (perf/cluster_levels.sh:
# the sum alone at 2 and 4 nodes with the bytes node 0 sent, then the wide MLP at 4 nodes). Needs root (namespaces);
# skipped with the reason otherwise.
section_cluster_sum() {
  need_emulated_nodes
  { echo "# $(machine)"; bash perf/cluster_levels.sh "$build" 2 4; } | tee "$out/cluster_levels.txt"
}

# cluster_sum: the gradient's sum where it is most of the step, across emulated nodes (scripts/cluster.sh): on nodes
# of 2 ranks each at 1 Gbit/s, MPI's allreduce, the ring in node order and two levels, interleaved (perf/cluster_levels.sh:
# the sum alone at 2 and 4 nodes with the bytes node 0 sent, then the wide MLP at 4 nodes). Needs root (namespaces);
# skipped with the reason otherwise.
section_cluster_sum() {
  command -v mpirun >/dev/null || skip "no mpirun (openmpi-bin)"
  grep -q '^STEALBATCH_MPI:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null || skip "$build is not built with STEALBATCH_MPI"
  local rc
  bash scripts/cluster.sh up 2 >/dev/null
  rc=$?
  [ $rc -eq 77 ] && skip "this machine cannot make network namespaces (scripts/cluster.sh says why)"
  [ $rc -eq 0 ] || return 1
  trap 'bash scripts/cluster.sh down >/dev/null 2>&1' EXIT
  { echo "# $(machine)"; bash perf/cluster_levels.sh "$build" 2 4; } | tee "$out/cluster_levels.txt"
}

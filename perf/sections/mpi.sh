# mpi: across MPI ranks (Open MPI, osc sm, every rank on this machine): 4 ranks against DDP (with TORCH_PYTHON), one
# remote steal (dequebench --remote), stealbench at 2 to 16 ranks of 2 or 4 devices, the step's fixed cost
# (--time-scale 0.01) and steps three times as long (--time-scale 60), and a 20 s soak across 2 ranks.
section_mpi() {
  command -v mpirun >/dev/null || skip "no mpirun (openmpi-bin)"
  grep -q '^STEALBATCH_MPI:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null || skip "$build is not built with STEALBATCH_MPI"
  if [ -n "${TORCH_PYTHON:-}" ]; then
    python3 perf/compare_torch.py --torch-python "$TORCH_PYTHON" --build "$build" --rows mpi-slowed,mpi --runs 3 --json "$out/compare_mpi.json" \
      | tee "$out/compare_mpi.txt"
  else
    echo "4 ranks against DDP: skipped (set TORCH_PYTHON)"
  fi
  "${mpi[@]}" -np 2 "$build/perf/dequebench" --remote --steals 100000 | tee "$out/remote_steal.txt"
  : >"$out/stealbench_mpi.txt"
  for rk in 2x2 4x2 8x2 16x2 2x4 4x4; do
    local r=${rk%x*} k=${rk#*x}
    "${mpi[@]}" -np "$r" "$build/perf/stealbench" --devices-per-rank "$k" --scenario seed-slow,hetero,slowdown --policy static,steal-adaptive \
      --steps 21 --batch $((256 * r * k)) --json "$out/stealbench_mpi_${rk}.json" 2>/dev/null | tee -a "$out/stealbench_mpi.txt"
  done
  : >"$out/stealbench_mpi_scale.txt"
  for r in 4 8; do
    for ts in 0.01 60; do
      "${mpi[@]}" -np "$r" "$build/perf/stealbench" --devices-per-rank 2 --scenario slowdown --policy static,steal-adaptive --steps 21 \
        --batch $((512 * r)) --time-scale "$ts" 2>/dev/null | grep -E '^slowdown' | sed "s/^/${r}x2 time-scale $ts: /" | tee -a "$out/stealbench_mpi_scale.txt"
    done
  done
  "${mpi[@]}" -np 2 "$build/perf/soak" --across-ranks --seconds 20 2>/dev/null | tee "$out/soak_mpi.txt"
}

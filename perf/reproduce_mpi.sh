#!/usr/bin/env bash
# The measurements behind perf/README.md's "Across processes" section, into results/ (not committed): 4 MPI ranks
# against DDP (with TORCH_PYTHON), one remote steal's latency, stealbench across 2 to 16 ranks, the step's fixed cost
# and longer steps, and a 20 s soak across 2 ranks. About 10 minutes on two cores.
#
#   TORCH_PYTHON=~/torch-venv/bin/python bash perf/reproduce_mpi.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results
mkdir -p "$out"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca osc sm)
log() { printf '\n== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), commit $(git rev-parse --short HEAD)"
if [ -n "${TORCH_PYTHON:-}" ]; then
  log "4 ranks against DDP"
  python3 perf/compare_torch.py --torch-python "$TORCH_PYTHON" --build "$build" --rows mpi-slowed,mpi --runs 3 --json "$out/compare_mpi.json" | tee "$out/compare_mpi.txt"
fi
log "one remote steal"
"${mpi[@]}" -np 2 "$build/perf/dequebench" --remote --steals 100000 | tee "$out/remote_steal.txt"
log "stealbench across ranks"
: >"$out/stealbench_mpi.txt"
for rk in 2x2 4x2 8x2 16x2 2x4 4x4; do
  r=${rk%x*} k=${rk#*x}
  "${mpi[@]}" -np "$r" "$build/perf/stealbench" --devices-per-rank "$k" --scenario seed-slow,hetero,slowdown --policy static,steal-adaptive \
    --steps 21 --batch $((256 * r * k)) --json "$out/stealbench_mpi_${rk}.json" 2>/dev/null | tee -a "$out/stealbench_mpi.txt"
done
log "the step's fixed cost (--time-scale 0.01) and steps three times as long (--time-scale 60), slowdown"
: >"$out/stealbench_mpi_scale.txt"
for r in 4 8; do
  for ts in 0.01 60; do
    "${mpi[@]}" -np "$r" "$build/perf/stealbench" --devices-per-rank 2 --scenario slowdown --policy static,steal-adaptive --steps 21 \
      --batch $((512 * r)) --time-scale "$ts" 2>/dev/null | grep -E '^slowdown' | sed "s/^/${r}x2 time-scale $ts: /" | tee -a "$out/stealbench_mpi_scale.txt"
  done
done
log "soak across 2 ranks, 20 s"
"${mpi[@]}" -np 2 "$build/perf/soak" --across-ranks --seconds 20 2>/dev/null | tee "$out/soak_mpi.txt"
log "done: $out/"

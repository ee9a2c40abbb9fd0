#!/usr/bin/env bash
# Runs every measurement behind perf/README.md on this machine, one after another, into results/ (not committed),
# and redraws perf/charts/. About 25 minutes on two cores (the MPI part: perf/reproduce_mpi.sh). The PyTorch rows need a Python with torch installed by
# hand (never a build or test dependency); without TORCH_PYTHON they are skipped.
#
#   TORCH_PYTHON=~/torch-venv/bin/python bash perf/reproduce.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=results
mkdir -p "$out"
log() { printf '\n== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), commit $(git rev-parse --short HEAD)"

log "the main job"
"$build/examples/mlp" --compare --devices cpu:4 --slowdown 6.6,6.6,1,1 --epochs 1 --json "$out/mlp_compare.json" 2>/dev/null | tee "$out/main_job.txt"

log "kernels: gemmbench (OpenBLAS as it detects itself, then with its core named)"
"$build/perf/gemmbench" --json "$out/gemmbench.json" | tee "$out/gemmbench.txt"
OPENBLAS_CORETYPE=SkylakeX "$build/perf/gemmbench" --libs openblas | tee "$out/gemmbench_skylakex.txt"

if [ -n "${TORCH_PYTHON:-}" ]; then
  log "against PyTorch (interleaved) and the accuracy of the default runs"
  python3 perf/compare_torch.py --torch-python "$TORCH_PYTHON" --build "$build" --runs 3 --accuracy --json "$out/compare_torch.json" | tee "$out/compare_torch.txt"
else
  log "against PyTorch: skipped (set TORCH_PYTHON)"
fi

if [ -x "$build/examples/torch_mlp" ]; then
  log "the libtorch adapter: against plain libtorch, the main job's slowdown, accuracy"
  bash perf/torch_adapter_figures.sh "$build" | tee "$out/torch_adapter.txt"
fi

log "samples/s against chunk size"
python3 perf/efficiency_curve.py --build "$build" --runs 3 --json "$out/efficiency_mlp.json" --svg perf/charts/efficiency_curve_mlp.svg | tee "$out/efficiency_mlp.txt"
python3 perf/efficiency_curve.py --build "$build" --example cnn --runs 3 --chunks 4,8,16,32,64 --epochs 3 --json "$out/efficiency_cnn.json" \
  --svg perf/charts/efficiency_curve_cnn.svg -- --limit 20000 | tee "$out/efficiency_cnn.txt"
python3 perf/efficiency_curve.py --build "$build" --devices cpu:4 --runs 3 --chunks 32,64,128,256 --json "$out/efficiency_mainjob.json" \
  -- --slowdown 6.6,6.6,1,1 | tee "$out/efficiency_mainjob.txt"

log "stealbench at 4, 16 and 32 simulated devices, and the scale sweep"
"$build/perf/stealbench" --scenario seed-slow,seed-skew,hetero,varcost,slowdown --overhead --json "$out/sb4.json" 2>/dev/null | tee "$out/sb4.txt"
for n in 16 32; do
  "$build/perf/stealbench" --scenario seed-slow,seed-skew,hetero,varcost,slowdown --policy static,lbbsp,steal-adaptive --devices "$n" \
    --batch $((n * 256)) --overhead --json "$out/sb$n.json" 2>/dev/null | tee "$out/sb$n.txt"
done
"$build/perf/stealbench" --scenario scale --policy static,lbbsp,central,steal,steal-adaptive --overhead --json "$out/sb_scale.json" 2>/dev/null \
  | tee "$out/sb_scale.txt"
python3 perf/tail_model.py | tee "$out/tail_model.txt"

log "the deque against its peers, the runtime's cost per chunk"
"$build/perf/dequebench" --json "$out/dequebench.json" | tee "$out/dequebench.txt"
: >"$out/chunk_overhead.txt"
for spec in "cpu:2 steal" "cpu:2 static" "cpu:4 steal"; do
  set -- $spec
  "$build/perf/stealbench" --chunk-overhead --devices "$1" --policy "$2" | tee -a "$out/chunk_overhead.txt"
done

log "soak: 180 s of random faults"
"$build/perf/soak" --seconds 180 --json "$out/soak.json" 2>/dev/null | tee "$out/soak.txt"

log "checkpoints: save and load times, the kill test, PyTorch reading one"
bash perf/checkpoint_times.sh "$build" | tee "$out/checkpoint_times.txt"
bash tests/checkpoint/kill_test.sh "$build/tests/checkpoint/save_loop" 50 | tee "$out/kill_test.txt"
bash perf/resume_figures.sh "$build" | tee "$out/resume_figures.txt"
if [ -n "${TORCH_PYTHON:-}" ] && "$TORCH_PYTHON" -c "import safetensors" 2>/dev/null; then
  : > "$out/checkpoint_interop.txt"  # this run's two models only
  for m in "mlp 10" "cnn 4"; do
    set -- $m
    python3 perf/checkpoint_interop.py --torch-python "$TORCH_PYTHON" --build "$build" --model "$1" --epochs "$2" | tee -a "$out/checkpoint_interop.txt"
  done
else
  log "PyTorch reading a checkpoint: skipped (TORCH_PYTHON with safetensors installed)"
fi

if command -v mpirun >/dev/null && grep -q '^STEALBATCH_MPI:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  log "across MPI ranks"
  bash perf/reproduce_mpi.sh "$build"
fi

log "charts"
bash perf/stealbench_charts.sh "$build"
log "done: $out/"

#!/usr/bin/env bash
# The perf harness: every measurement behind perf/README.md, one section after another, into results/ (not
# committed); the charts into perf/charts/. Each section is a function in perf/sections/NAME.sh; the table below is
# the order they run in. The PyTorch rows need a Python with torch installed by hand (never a build or test
# dependency): without TORCH_PYTHON they are skipped.
#
#   bash perf/reproduce.sh [--only SECTION[,SECTION]] [--list] [BUILD_DIR]       (BUILD_DIR: build/ by default)
#   TORCH_PYTHON=~/torch-venv/bin/python bash perf/reproduce.sh
#
# A section exits 0 (ran), 77 (skipped: it says why) or anything else (failed); the footer counts them, and the
# harness exits 1 if any failed.
set -uo pipefail

# name          what it measures (and what it needs beyond the build)
sections=(
  "main_job       mlp --compare on cpu:4 with two devices slowed 6.6x, once; 7 interleaved rounds, medians"
  "kernels        gemmbench: single-thread sgemm of the MLP's training pass, OpenBLAS, BLIS and oneDNN"
  "torch          the examples against PyTorch and DDP, interleaved; accuracy (TORCH_PYTHON)"
  "torch_adapter  the libtorch adapter against plain libtorch; the main job through it (a libtorch build)"
  "torch_lm       a transformer on variable-length text: static, packer, steal with and without costs, DDP (TORCH_PYTHON)"
  "python         the Python package: its chunks against the C++ adapter; its transformer beside its DDP script; the launches (a Python build)"
  "deterministic  --deterministic against the default, interleaved; the parameters' SHA-256 across devices, policies, ranks"
  "efficiency     samples/s against chunk size: mlp, cnn, the main job; draws perf/charts/efficiency_curve_*"
  "stealbench     the runtime on simulated devices: 4, 16 and 32 devices, the scale sweep; the tail model"
  "deque          dequebench, the deque against its peers; stealbench --chunk-overhead, the cost per chunk"
  "soak           180 s of random faults: every chunk exactly once, exact gradients, timeouts"
  "checkpoint     save and load times, resume against straight, the kill test; PyTorch reading one (TORCH_PYTHON)"
  "mpi            across MPI ranks: DDP, one remote steal, stealbench at 2 to 16 ranks, a soak (an MPI build)"
  "cluster        across emulated nodes (namespaces): remote steals, the reduction at 10 and 1 Gbit/s, stealbench, DDP (root)"
  "cluster_sum    the gradient's sum on nodes of 2 ranks: MPI's, the ring, two levels, alone and in training (root)"
  "cluster_ddp    the wide MLP against DDP across 4 nodes at 1 and 10 Gbit/s, where the sum is most of the step (root; TORCH_PYTHON)"
  "cluster_model  the discrete-event model of the cross-rank step: validated at 2 to 16 ranks, then run to 10,000 (MPI; root for the emulated nodes)"
  "charts         the stealbench sweeps behind perf/charts/, 4 SVGs (matplotlib)"
)

cd "$(dirname "$0")/.."
usage() { sed -n 's/^#   \(bash perf\/reproduce.sh .*\)/\1/p' "$0" | head -1; }
list() {
  echo "# sections of perf/reproduce.sh, in the order they run (perf/README.md has one section each):"
  printf '  %s\n' "${sections[@]}"
}
names=()
for s in "${sections[@]}"; do names+=("${s%% *}"); done

only="" build=""
while [ $# -gt 0 ]; do
  case $1 in
    --list) list; exit 0 ;;
    --only) [ $# -ge 2 ] || { echo "reproduce: --only needs SECTION[,SECTION]" >&2; exit 2; }; only=$2; shift 2 ;;
    --only=*) only=${1#--only=}; shift ;;
    -h | --help) echo "usage: $(usage)"; list; exit 0 ;;
    -*) echo "reproduce: unknown flag '$1'; usage: $(usage)" >&2; exit 2 ;;
    *) [ -z "$build" ] || { echo "reproduce: one BUILD_DIR only (got '$build' and '$1')" >&2; exit 2; }; build=$1; shift ;;
  esac
done
run=("${names[@]}")
if [ -n "$only" ]; then
  IFS=, read -r -a run <<<"$only"
  for s in "${run[@]}"; do
    [[ " ${names[*]} " == *" $s "* ]] || { echo "reproduce: no section '$s'; sections: ${names[*]}" >&2; exit 2; }
  done
fi
build=${build:-build}
[ -d "$build/perf" ] || { echo "reproduce: no perf programs in '$build' (build first: cmake --build $build)" >&2; exit 2; }
build=$(cd "$build" && pwd)


out=results
mkdir -p "$out"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca osc sm)
log() { printf '\n== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
# The machine and the commit measured, for every result file's header.
machine() {
  local commit
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit (modified)"
  echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), commit $commit, $(date -u +%F)"
}
skip() { echo "skipped: $*"; exit 77; }
# For a section across emulated nodes (scripts/cluster.sh): skips it without mpirun, an MPI build or namespaces, and
# tears the nodes down when the section ends.
need_emulated_nodes() {
  command -v mpirun >/dev/null || skip "no mpirun (openmpi-bin)"
  grep -q '^STEALBATCH_MPI:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null || skip "$build is not built with STEALBATCH_MPI"
  local rc=0
  trap 'bash scripts/cluster.sh down >/dev/null 2>&1' EXIT
  bash scripts/cluster.sh up 2 >/dev/null || rc=$?
  [ $rc -eq 77 ] && skip "this machine cannot make network namespaces (scripts/cluster.sh says why)"
  [ $rc -eq 0 ] || exit 1
}

log "perf/reproduce.sh: ${run[*]}; build $build; $(machine)"
ran=() skipped=() failed=()
for s in "${run[@]}"; do
  log "$s"
  # Each section in a subshell of its own with -e: a failing command ends its section, not the run.
  (
    set -euo pipefail
    source "perf/sections/$s.sh"
    "section_$s"
  )
  rc=$?
  case $rc in
    0) ran+=("$s") ;;
    77) skipped+=("$s") ;;
    127) failed+=("$s (exit 127: a program not found; build every target)") ;;
    *) failed+=("$s (exit $rc)") ;;
  esac
done
log "summary: ran ${#ran[@]} (${ran[*]}), skipped ${#skipped[@]} (${skipped[*]}), failed ${#failed[@]} (${failed[*]}); results in $out/"
[ ${#failed[@]} -eq 0 ]

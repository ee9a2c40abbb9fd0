#!/usr/bin/env bash
# Every GPU check in one run, on the verification machine (one H200, PyTorch and pip's NCCL and cuBLAS, no TBB,
# oneDNN, Boost or apt). Build and pack here first (bash perf/pack_device_check.sh), carry .devpack, then:
#
#   bash perf/device_check.sh [.devpack]
#
# Steps: 1 nvidia-smi and the GPU tests; 2 gpu_check, one process a section (a sticky CUDA error loses only its own
# section): GPU-vs-CPU gradient equivalence (the MLP, then the CNN), samples/s on one GPU with each way of waiting
# for it, vgpu with unequal parts (static vs steal vs the ideal), the chunk curve, the reduction; 3 the same models
# in PyTorch (perf/torch_ref.py, same batch and precision, same run), each step run eagerly, captured in one CUDA graph
# and under torch.compile, and the wide MLP at batch 16384: each row against PyTorch is judged against the fastest of
# these peers, named in the summary; 4 the examples on the GPU; 4b checkpoints
# across GPU and CPU; 4c the libtorch adapter on the GPU, built here against this machine's PyTorch (the build starts
# in the background as soon as the libraries are unpacked): the MLP, the CNN and TorchLm on variable-length documents,
# against eager libtorch, and TorchLm's static against steal on vgpu parts; 5 stealbench at 16 and 32 simulated devices on this
# machine's cores (no GPU: the build machine has two cores for 32 device threads).
#
# What comes back: the device tool returns at most 8 files from $OUT, at most two folders down. $OUT (or
# ./device_check_out) gets three: device_check.log (everything printed), steps.tsv (each step's status, seconds and
# first error line) and device_check.json (the summary's rows, each section's own JSON embedded, and every missing
# figure with its reason). Everything else, checkpoints included, is scratch under DEVICE_CHECK_SCRATCH
# (/tmp/stealbatch-device-check).
#
# The whole run keeps to one deadline, DEVICE_CHECK_DEADLINE_S (480 s: the device tool allows 600 s a command and
# 900 s of device time in all, start-up included). Each step's limit is cut to the time left, a step with less than
# DEVICE_CHECK_MIN_STEP_S (20 s) left is skipped with a line that says so, and the summary table prints on any exit,
# naming every missing figure. Exit status: 0 when every step ran and every target holds.
set -uo pipefail
PACK=$(cd "${1:-.devpack}" 2>/dev/null && pwd) || { echo "device_check: no pack at ${1:-.devpack} (run perf/pack_device_check.sh here first)"; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/device_check_out}
SCRATCH=${DEVICE_CHECK_SCRATCH:-/tmp/stealbatch-device-check}
export OUT SCRATCH  # the steps run through bash -c read them
DEADLINE_S=${DEVICE_CHECK_DEADLINE_S:-480}
MIN_STEP_S=${DEVICE_CHECK_MIN_STEP_S:-20}
mkdir -p "$OUT"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH/log" "$SCRATCH/json"
# A limit that signals the whole process group must not take the log's tee with it: the summary still has to get out.
trap '' PIPE
exec > >(trap '' INT TERM; exec tee "$OUT/device_check.log") 2>&1
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { printf '\n== [%3ds] %s\n' "$(elapsed)" "$*"; }
fails=0
STEP_PID=
declare -A BG_PID=() BG_START=() BG_LIMIT=()
printf 'step\tstatus\tseconds\tfirst_error\n' > "$OUT/steps.tsv"
# The first line of a failed step's output that names an error (else its last line), for the summary.
first_error() {
  local log=$1 l
  l=$(grep -a -m1 -i -A3 -E "error|fail|what\(\)|abort|terminat|illegal|exception|not found|cannot|no such|no gpu|denied|killed" "$log" 2>/dev/null |
    grep -v '^[[:space:]]*$' | head -n 2)
  # A line that ends in ':' (CMake's "CMake Error at ...:") is followed by what it is about: keep both.
  case $l in *:$'\n'*) l=${l//$'\n'/ } ;; *) l=${l%%$'\n'*} ;; esac
  [ -n "$l" ] || l=$(grep -a -v '^[[:space:]]*$' "$log" 2>/dev/null | tail -n 1)
  printf '%s' "$l" | tr '\t\r' '  ' | cut -c1-200
}
note_step() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >> "$OUT/steps.tsv"; }
finish_step() {  # NAME RC LIMIT TOOK: the step's line in steps.tsv, and a count of the failures
  local name=$1 rc=$2 limit=$3 took=$4 err=
  [ $rc -eq 0 ] || { sleep 0.2; err=$(first_error "$SCRATCH/log/$name.log"); }  # let the step's tee write its last lines
  if [ $rc -eq 0 ]; then
    note_step "$name" ok "$took"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "device_check: $name timed out after $limit s"
    note_step "$name" "timed out ($limit s)" "$took" "$err"
    fails=$((fails + 1))
  else
    echo "device_check: $name exited $rc"
    note_step "$name" "exit $rc" "$took" "$err"
    fails=$((fails + 1))
  fi
}
# The limit a step may have: its own, cut to the deadline, in STEP_LIMIT; fails (and the step is reported skipped)
# when too little is left.
step_limit() {
  local name=$1 left=$(( DEADLINE_S - $(elapsed) ))
  STEP_LIMIT=$2
  if [ "$left" -lt "$MIN_STEP_S" ]; then
    echo "device_check: SKIPPED $name: ${left} s left of the ${DEADLINE_S} s deadline (a step needs ${MIN_STEP_S} s)"
    note_step "$name" skipped 0 "${left} s left of the ${DEADLINE_S} s deadline"
    fails=$((fails + 1))
    return 1
  fi
  [ "$STEP_LIMIT" -gt "$left" ] && STEP_LIMIT=$left
  return 0
}

run() {  # run NAME LIMIT_S CMD...: a step that must not hang the script, nor outlive the deadline
  local name=$1 limit start rc
  step_limit "$1" "$2" || return 125
  limit=$STEP_LIMIT
  shift 2
  start=$(date +%s)
  # In the background, so that a signal to this script runs its trap now, not when the step ends; its output goes to
  # the log as it comes, and to the step's own scratch log for its first error line.
  timeout --kill-after=5 "$limit" "$@" > >(tee "$SCRATCH/log/$name.log") 2>&1 &
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID=
  finish_step "$name" "$rc" "$limit" $(( $(date +%s) - start ))
  return $rc
}

bg_start() {  # bg_start NAME LIMIT_S CMD...: a step that runs while the others do; bg_wait NAME collects it
  local name=$1 limit
  step_limit "$1" "$2" || return 125
  limit=$STEP_LIMIT
  shift 2
  BG_START[$name]=$(date +%s)
  BG_LIMIT[$name]=$limit
  timeout --kill-after=5 "$limit" "$@" > "$SCRATCH/log/$name.log" 2>&1 &
  BG_PID[$name]=$!
  echo "device_check: $name started in the background (limit $limit s)"
}
bg_wait() {
  local name=$1 rc
  [ -n "${BG_PID[$name]:-}" ] || return 125  # never started: already reported skipped
  STEP_PID=${BG_PID[$name]}
  wait "$STEP_PID"
  rc=$?
  STEP_PID=
  unset "BG_PID[$name]"
  echo "device_check: $name (in the background) ended after $(( $(date +%s) - BG_START[$name] )) s; the last lines of its output:"
  tail -n 40 "$SCRATCH/log/$name.log"
  finish_step "$name" "$rc" "${BG_LIMIT[$name]}" $(( $(date +%s) - BG_START[$name] ))
  return $rc
}

summary() {  # on every exit: the figures that came, and a line for each that did not
  trap - EXIT INT TERM
  local p
  for p in "${BG_PID[@]}"; do kill "$p" 2>/dev/null; done
  say "summary"
  python3 "$REPO/perf/device_check_summary.py" "$OUT" "$SCRATCH/json" || fails=$((fails + 1))
  say "done: $fails failed or skipped step(s) and failed target(s), $(elapsed) s of the ${DEADLINE_S} s deadline"
  [ "$fails" -eq 0 ]
  exit $?
}
trap summary EXIT
interrupted() {
  echo "device_check: interrupted by SIG$1"
  local p
  for p in $STEP_PID "${BG_PID[@]}"; do
    kill "$p" 2>/dev/null
    wait "$p" 2>/dev/null  # timeout forwards the signal and kills its step 5 s later at the latest
  done
  BG_PID=()
  fails=$((fails + 1))
  exit 1
}
trap 'interrupted INT' INT
trap 'interrupted TERM' TERM

say "machine"
head -2 /etc/os-release; ldd --version | head -1
echo "cores: $(nproc); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
ORIG_LD=${LD_LIBRARY_PATH:-}
# Four vgpu parts with a compute and a copy stream each, plus each green context's own stream: more than CUDA's
# default 8 hardware queues, which would make the parts wait on each other (cuda.h on CUDA_DEVICE_MAX_CONNECTIONS).
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
echo "CUDA_DEVICE_MAX_CONNECTIONS=$CUDA_DEVICE_MAX_CONNECTIONS"

say "libraries"
LIB=/tmp/stealbatch-lib
mkdir -p "$LIB"
shopt -s nullglob
for f in "$PACK"/lib/*.xz; do
  base=$(basename "$f" .xz)
  xz -dc "$f" > "$LIB/$base" 2>/dev/null || python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$LIB/$base"
done
shopt -u nullglob
# pip's NCCL and cuBLAS (nvidia/nccl/lib, nvidia/cublas/lib, or the CUDA 13 wheels' nvidia/cu13/lib), else the toolkit's.
SITES=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
libdir() { local f; f=$(find $SITES /usr/local/cuda/lib64 /usr/local/cuda/lib -name "$1" 2>/dev/null | head -n 1); [ -n "$f" ] && dirname "$f"; }
NCCL_LIB=$(libdir libnccl.so.2)
CUBLAS_LIB=$(libdir libcublas.so.13)
echo "NCCL from ${NCCL_LIB:-(not found)}, cuBLAS from ${CUBLAS_LIB:-(not found)}"
LD_LIBRARY_PATH="$LIB${NCCL_LIB:+:$NCCL_LIB}${CUBLAS_LIB:+:$CUBLAS_LIB}:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ldd "$PACK/bin/gpu_check" 2>&1 | grep -E "not found|nccl|cublas|tbb|dnnl|gomp|OpenCL|not a dynamic"

# The libtorch adapter and its check, compiled with PyTorch's CMake config and C++ ABI, linked with the packed static
# stealbatch libraries (perf/device_torch). PyTorch's config enables CUDA and torch/torch.h compiles twice: started
# now, in the background, and collected at step 4c. nvcc is named, not looked up on PATH.
TORCH_PREFIX=$(LD_LIBRARY_PATH="$ORIG_LD" python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
NVCC=$(command -v nvcc 2>/dev/null || true)
[ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
echo "torch cmake prefix: ${TORCH_PREFIX:-(none: python3 has no torch)}; nvcc: ${NVCC:-(not found)}"
bg_start torch_build 240 bash -c 'cmake -S "$0/perf/device_torch" -B "$1" -G Ninja -DCMAKE_PREFIX_PATH="$2" -DSB_PACK="$3" -DSB_LIBS="$4" \
  ${5:+-DCMAKE_CUDA_COMPILER="$5"} > "$1.configure.log" 2>&1 || { tail -40 "$1.configure.log"; exit 1; }
  cmake --build "$1" --parallel "$(nproc)" 2>&1 | tail -40; exit "${PIPESTATUS[0]}"' \
  "$REPO" "$SCRATCH/device-torch" "$TORCH_PREFIX" "$PACK" "$LIB;${NCCL_LIB:-};${CUBLAS_LIB:-}" "$NVCC"

# The Python package's extension (perf/device_python), built for this machine's Python with pip's pybind11 and the
# packed libraries, beside the adapter's build; collected at step 4d.
PYBIND11_DIR=$(LD_LIBRARY_PATH="$ORIG_LD" python3 -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null)
echo "pybind11: ${PYBIND11_DIR:-(none: python3 has no pybind11)}"
bg_start python_build 180 bash -c 'cmake -S "$0/perf/device_python" -B "$1" -G Ninja -Dpybind11_DIR="$2" -DSB_PACK="$3" -DSB_LIBS="$4" \
  > "$1.configure.log" 2>&1 || { tail -40 "$1.configure.log"; exit 1; }
  cmake --build "$1" --parallel "$(nproc)" 2>&1 | tail -40; exit "${PIPESTATUS[0]}"' \
  "$REPO" "$SCRATCH/device-python" "$PYBIND11_DIR" "$PACK" "$LIB;${NCCL_LIB:-};${CUBLAS_LIB:-}"

say "1. nvidia-smi and the GPU tests"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv || echo "device_check: nvidia-smi failed"
run test_cuda_basics 60 "$PACK/bin/test_cuda_basics" --duration=true
run test_cuda_runtime 120 "$PACK/bin/test_cuda_runtime" --duration=true

say "2. gpu_check, a process a section: equivalence (MLP, then CNN), throughput, vgpu, the chunk curve, the reduction, deterministic mode"
for section in equivalence-mlp:30 equivalence-cnn:30 throughput-mlp:60 throughput-cnn:60 vgpu:90 curve:60 reduce:45 deterministic:40; do
  run "gpu_check:${section%%:*}" "${section##*:}" "$PACK/bin/gpu_check" --data "$PACK/data" --section "${section%%:*}" \
    --json "$SCRATCH/json/gpu_check.${section%%:*}.json" ${GPU_CHECK_ARGS:-}
done

say "3. PyTorch peers (same models, fp32): eager (batch copied from the host; data on the GPU), one CUDA graph, torch.compile; mlp and cnn at batch 256, the wide mlp at 16384"
# torch.compile compiles each model on a cold cache while the adapter builds beside it: --budget-s builds no compile
# peer once 75 s have gone, so that the step ends within its 120 s with each model's other peers (torch_ref.py writes
# its JSON after each model). TORCH_REF_ARGS adds flags (--peers eager_host,eager,graph leaves torch.compile out);
# DEVICE_CHECK_TORCH_REF names a stand-in script (the rehearsal's).
TORCH_REF=${DEVICE_CHECK_TORCH_REF:-$REPO/perf/torch_ref.py}
LD_LIBRARY_PATH="$ORIG_LD" PYTHONUNBUFFERED=1 run torch_ref 120 python3 "$TORCH_REF" gpu --data "$PACK/data" --json "$SCRATCH/json/torch_ref.json" \
  --budget-s 75 ${TORCH_REF_ARGS:-}

say "4. examples on the GPU"
run mlp_cuda 90 "$PACK/bin/mlp" --data "$PACK/data" --devices cuda:0 --epochs 10 --json "$SCRATCH/json/mlp_gpu.json"
run mlp_cuda_graphs 90 "$PACK/bin/mlp" --data "$PACK/data" --devices cuda:0 --epochs 10 --gpu-graphs on --gpu-data device --json "$SCRATCH/json/mlp_gpu_graphs.json"
run mlp_vgpu 90 "$PACK/bin/mlp" --data "$PACK/data" --devices vgpu:64,16,16,16 --hidden 2048,2048 --batch 8192 --epochs 1 --compare
run cnn_cuda 120 "$PACK/bin/cnn" --data "$PACK/data" --devices cuda:0 --json "$SCRATCH/json/cnn_gpu.json"

say "4b. checkpoints: saved on cuda:0 and resumed on cpu:2, saved on cpu:2 and resumed on cuda:0 (mlp, 4 epochs), each against a straight run on the device it ends on"
# Summation orders differ between devices and between stealing runs, so a round trip is compared with a straight run
# of the device that finishes it, within a tolerance measured on straight runs (device_check_summary.py).
ck=(--data "$PACK/data" --epochs 4)
run ckpt_gpu_cpu 60 bash -c '"$0" "${@:1:4}" --devices cuda:0 --stop-after 2 --save "$SCRATCH/ckpt_gc" &&
  "$0" "${@:1:4}" --devices cpu:2 --resume "$SCRATCH/ckpt_gc" --json "$SCRATCH/json/ckpt_gpu_cpu.json"' "$PACK/bin/mlp" "${ck[@]}"
run ckpt_cpu_gpu 60 bash -c '"$0" "${@:1:4}" --devices cpu:2 --stop-after 2 --save "$SCRATCH/ckpt_cg" &&
  "$0" "${@:1:4}" --devices cuda:0 --resume "$SCRATCH/ckpt_cg" --json "$SCRATCH/json/ckpt_cpu_gpu.json"' "$PACK/bin/mlp" "${ck[@]}"
run ckpt_straight_cpu 60 "$PACK/bin/mlp" "${ck[@]}" --devices cpu:2 --json "$SCRATCH/json/ckpt_straight_cpu.json"
run ckpt_straight_gpu 60 "$PACK/bin/mlp" "${ck[@]}" --devices cuda:0 --json "$SCRATCH/json/ckpt_straight_gpu.json"

say "4c. the libtorch adapter on cuda:0, built against this machine's PyTorch (perf/device_torch)"
# The adapter's gradient on cuda:0 against cpu:1 and its samples/s (TorchLm: tokens/s) against libtorch eager; TorchLm's
# static against steal on four equal vgpu parts, each batch grouped by length.
TORCH_LIB=$(dirname "$TORCH_PREFIX" 2>/dev/null)/../lib
bg_wait torch_build || { note_step torch_gpu_check "not run" 0 "torch_build failed"; false; } &&
  run torch_gpu_check 180 env LD_LIBRARY_PATH="$TORCH_LIB:$LD_LIBRARY_PATH" "$SCRATCH/device-torch/torch_gpu_check" --json "$SCRATCH/json/torch_gpu_check.json"

say "4d. the Python package on cuda:0 (perf/python_gpu_check.py): its gradient against PyTorch's, its samples/s against the adapter's"
bg_wait python_build || { note_step python_gpu_check "not run" 0 "python_build failed"; false; } &&
  PYTHONPATH="$SCRATCH/device-python" LD_LIBRARY_PATH="$TORCH_LIB:$LD_LIBRARY_PATH" run python_gpu_check 90 python3 "$REPO/perf/python_gpu_check.py" \
  --adapter-json "$SCRATCH/json/torch_gpu_check.json" --json "$SCRATCH/json/python_gpu_check.json"

say "5. stealbench: 16 and 32 simulated devices on $(nproc) cores (no GPU)"
for n in 16 32; do  # 256 samples per device, as in the performance document's tables
  run "stealbench$n" 90 "$PACK/bin/stealbench" --scenario seed-slow,seed-skew,hetero,varcost,slowdown --policy static,lbbsp,steal-adaptive \
    --devices "$n" --batch $((n * 256)) --overhead --json "$SCRATCH/json/stealbench$n.json" 2>/dev/null
done

#!/usr/bin/env bash
# Every GPU check in one run, on the verification machine (one H200, PyTorch and pip's NCCL and cuBLAS, no TBB,
# oneDNN or apt). Build and pack here first (bash perf/pack_device_check.sh), carry .devpack, then:
#
#   bash perf/device_check.sh [.devpack]
#
# Steps: 1 nvidia-smi and the GPU tests; 2 gpu_check: GPU-vs-CPU gradient equivalence (MLP, CNN), samples/s on one
# GPU with each way of waiting for it, vgpu with unequal parts (static vs steal vs the ideal), the NCCL AllReduce
# time; 3 the same models in PyTorch (perf/torch_ref.py, same batch and precision, same run); 4 the examples on the
# GPU; 4b checkpoints across GPU and CPU; 4c the libtorch adapter on the GPU, built here against this machine's
# PyTorch; 5 stealbench at 16 and 32 simulated devices on this machine's cores (no GPU: the build machine has two
# cores for 32 device threads). Writes device_check.log, steps.tsv, gpu_check.json, torch_ref.json,
# torch_gpu_check.json, stealbench16/32.json and device_check.json under $OUT (or ./device_check_out).
#
# The whole run keeps to one deadline, DEVICE_CHECK_DEADLINE_S (480 s: the device tool allows 600 s a command and
# 900 s of device time in all, start-up included). Each step's limit is cut to the time left, a step with less than
# DEVICE_CHECK_MIN_STEP_S (20 s) left is skipped with a line that says so, and the summary table prints on any exit,
# naming every missing figure. Exit status: 0 when every step ran and every target holds.
set -uo pipefail
PACK=$(cd "${1:-.devpack}" 2>/dev/null && pwd) || { echo "device_check: no pack at ${1:-.devpack} (run perf/pack_device_check.sh here first)"; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/device_check_out}
export OUT  # the steps run through bash -c read it
DEADLINE_S=${DEVICE_CHECK_DEADLINE_S:-480}
MIN_STEP_S=${DEVICE_CHECK_MIN_STEP_S:-20}
mkdir -p "$OUT"
# A limit that signals the whole process group must not take the log's tee with it: the summary still has to get out.
trap '' PIPE
exec > >(trap '' INT TERM; exec tee "$OUT/device_check.log") 2>&1
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { printf '\n== [%3ds] %s\n' "$(elapsed)" "$*"; }
fails=0
STEP_PID=
printf 'step\tstatus\tseconds\n' > "$OUT/steps.tsv"
note_step() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT/steps.tsv"; }

run() {  # run NAME LIMIT_S CMD...: a step that must not hang the script, nor outlive the deadline
  local name=$1 limit=$2; shift 2
  local left=$(( DEADLINE_S - $(elapsed) ))
  if [ "$left" -lt "$MIN_STEP_S" ]; then
    echo "device_check: SKIPPED $name: ${left} s left of the ${DEADLINE_S} s deadline (a step needs ${MIN_STEP_S} s)"
    note_step "$name" skipped 0
    fails=$((fails + 1))
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start rc
  start=$(date +%s)
  # In the background, so that a signal to this script runs its trap now, not when the step ends.
  timeout --kill-after=5 "$limit" "$@" &
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID=
  local took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then
    note_step "$name" ok "$took"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "device_check: $name timed out after $limit s"
    note_step "$name" "timed out ($limit s)" "$took"
    fails=$((fails + 1))
  else
    echo "device_check: $name exited $rc"
    note_step "$name" "exit $rc" "$took"
    fails=$((fails + 1))
  fi
  return $rc
}

summary() {  # on every exit: the figures that came, and a line for each that did not
  trap - EXIT INT TERM
  say "summary"
  python3 "$REPO/perf/device_check_summary.py" "$OUT" || fails=$((fails + 1))
  say "done: $fails failed or skipped step(s) and failed target(s), $(elapsed) s of the ${DEADLINE_S} s deadline"
  [ "$fails" -eq 0 ]
  exit $?
}
trap summary EXIT
interrupted() {
  echo "device_check: interrupted by SIG$1"
  if [ -n "$STEP_PID" ]; then
    kill "$STEP_PID" 2>/dev/null
    wait "$STEP_PID" 2>/dev/null  # timeout forwards the signal and kills its step 5 s later at the latest
  fi
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

say "1. nvidia-smi and the GPU tests"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv || echo "device_check: nvidia-smi failed"
run test_cuda_basics 60 "$PACK/bin/test_cuda_basics" --duration=true
run test_cuda_runtime 120 "$PACK/bin/test_cuda_runtime" --duration=true

say "2. gpu_check: equivalence, throughput (spin and blocking waits), vgpu, AllReduce"
run gpu_check 180 "$PACK/bin/gpu_check" --data "$PACK/data" --json "$OUT/gpu_check.json" ${GPU_CHECK_ARGS:-}

say "3. PyTorch reference (same models, batch 256, fp32)"
LD_LIBRARY_PATH="$ORIG_LD" PYTHONUNBUFFERED=1 run torch_ref 120 python3 "$REPO/perf/torch_ref.py" --data "$PACK/data" --json "$OUT/torch_ref.json"

say "4. examples on the GPU"
run mlp_cuda 90 "$PACK/bin/mlp" --data "$PACK/data" --devices cuda:0 --epochs 10 --json "$OUT/mlp_gpu.json"
run mlp_vgpu 90 "$PACK/bin/mlp" --data "$PACK/data" --devices vgpu:64,16,16,16 --hidden 2048,2048 --batch 8192 --epochs 1 --compare
run cnn_cuda 120 "$PACK/bin/cnn" --data "$PACK/data" --devices cuda:0 --json "$OUT/cnn_gpu.json"

say "4b. a checkpoint saved on cuda:0 and resumed on cpu:2, and one saved on cpu:2 and resumed on cuda:0 (mlp, 4 epochs)"
ck=(--data "$PACK/data" --epochs 4)
run ckpt_gpu_cpu 60 bash -c '"$0" "${@:1:4}" --devices cuda:0 --stop-after 2 --save "$OUT/ckpt_gc" >/dev/null &&
  "$0" "${@:1:4}" --devices cpu:2 --resume "$OUT/ckpt_gc" --json "$OUT/ckpt_gpu_cpu.json"' "$PACK/bin/mlp" "${ck[@]}"
run ckpt_cpu_gpu 60 bash -c '"$0" "${@:1:4}" --devices cpu:2 --stop-after 2 --save "$OUT/ckpt_cg" >/dev/null &&
  "$0" "${@:1:4}" --devices cuda:0 --resume "$OUT/ckpt_cg" --json "$OUT/ckpt_cpu_gpu.json"' "$PACK/bin/mlp" "${ck[@]}"
run ckpt_straight 60 "$PACK/bin/mlp" "${ck[@]}" --devices cpu:2 --json "$OUT/ckpt_straight.json"

say "4c. the libtorch adapter on cuda:0, built against this machine's PyTorch (perf/device_torch)"
# The adapter and its check compiled here with PyTorch's CMake config and C++ ABI, linked with the packed static
# stealbatch libraries; then the adapter's gradient on cuda:0 against cpu:1 and its samples/s against libtorch eager.
TORCH_PREFIX=$(LD_LIBRARY_PATH="$ORIG_LD" python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
echo "torch cmake prefix: ${TORCH_PREFIX:-(none: python3 has no torch)}"
run torch_build 150 bash -c 'cmake -S "$0/perf/device_torch" -B "$1" -G Ninja -DCMAKE_PREFIX_PATH="$2" -DSB_PACK="$3" -DSB_LIBS="$4" > "$1.configure.log" 2>&1 ||
  { tail -40 "$1.configure.log"; exit 1; }; cmake --build "$1" --parallel "$(nproc)" 2>&1 | tail -40; exit "${PIPESTATUS[0]}"' \
  "$REPO" /tmp/stealbatch-device-torch "$TORCH_PREFIX" "$PACK" "$LIB;${NCCL_LIB:-};${CUBLAS_LIB:-}"
TORCH_LIB=$(dirname "$TORCH_PREFIX" 2>/dev/null)/../lib
run torch_gpu_check 120 env LD_LIBRARY_PATH="$TORCH_LIB:$LD_LIBRARY_PATH" /tmp/stealbatch-device-torch/torch_gpu_check --json "$OUT/torch_gpu_check.json"

say "5. stealbench: 16 and 32 simulated devices on $(nproc) cores (no GPU)"
for n in 16 32; do  # 256 samples per device, as in the performance document's tables
  run "stealbench$n" 90 "$PACK/bin/stealbench" --scenario seed-slow,seed-skew,hetero,varcost,slowdown --policy static,lbbsp,steal-adaptive \
    --devices "$n" --batch $((n * 256)) --overhead --json "$OUT/stealbench$n.json" 2>/dev/null
done

#!/usr/bin/env bash
# Every GPU check in one run, on the verification machine (one H200, PyTorch and pip's NCCL and cuBLAS, no TBB,
# OpenBLAS or apt). Build and pack here first (bash perf/pack_device_check.sh), carry .devpack, then:
#
#   bash perf/device_check.sh [.devpack]
#
# Steps: 1 nvidia-smi and the GPU tests; 2 GPU-vs-CPU gradient equivalence (MLP, CNN); 3 MLP and CNN samples/s
# on one GPU against PyTorch (perf/torch_ref.py, same model, batch and precision, same run); 4 vgpu with unequal
# parts: static vs steal vs the ideal; 5 the NCCL AllReduce time; then the examples on the GPU; 6 stealbench at
# 16 and 32 simulated devices on this machine's cores (no GPU: the build machine has two cores for 32 device
# threads). Writes device_check.log, gpu_check.json, torch_ref.json, stealbench16/32.json and device_check.json
# under $OUT (or ./device_check_out) and prints the summary table last. Exit status: 0 when every target holds.
set -uo pipefail
PACK=$(cd "${1:-.devpack}" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/device_check_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
T0=$(date +%s)
say() { printf '\n== [%3ds] %s\n' $(( $(date +%s) - T0 )) "$*"; }
fails=0
run() {  # run LIMIT_S CMD...: a step that must not hang the script
  local limit=$1; shift
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "device_check: '$*' exited $rc"; fails=$((fails + 1)); fi
  return $rc
}

say "machine"
head -2 /etc/os-release; ldd --version | head -1; nproc
ORIG_LD=${LD_LIBRARY_PATH:-}

say "libraries"
LIB=/tmp/stealbatch-lib
mkdir -p "$LIB"
for f in "$PACK"/lib/*.xz; do
  base=$(basename "$f" .xz)
  xz -dc "$f" > "$LIB/$base" 2>/dev/null || python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "$LIB/$base"
done
# pip's NCCL and cuBLAS (nvidia/nccl/lib, nvidia/cublas/lib, or the CUDA 13 wheels' nvidia/cu13/lib), else the toolkit's.
SITES=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
libdir() { local f; f=$(find $SITES /usr/local/cuda/lib64 /usr/local/cuda/lib -name "$1" 2>/dev/null | head -n 1); [ -n "$f" ] && dirname "$f"; }
NCCL_LIB=$(libdir libnccl.so.2)
CUBLAS_LIB=$(libdir libcublas.so.13)
echo "NCCL from ${NCCL_LIB:-(not found)}, cuBLAS from ${CUBLAS_LIB:-(not found)}"
export LD_LIBRARY_PATH="$LIB:${NCCL_LIB}:${CUBLAS_LIB}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ldd "$PACK/bin/gpu_check" | grep -E "not found|nccl|cublas|tbb|openblas"

say "1. nvidia-smi and the GPU tests"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
run 120 "$PACK/bin/test_cuda_basics" --duration=true
run 180 "$PACK/bin/test_cuda_runtime" --duration=true

say "2-5. gpu_check: equivalence, throughput, vgpu, AllReduce"
run 240 "$PACK/bin/gpu_check" --data "$PACK/data" --json "$OUT/gpu_check.json" ${GPU_CHECK_ARGS:-}

say "3. PyTorch reference (same models, batch 256, fp32)"
LD_LIBRARY_PATH="$ORIG_LD" PYTHONUNBUFFERED=1 run 180 python3 "$REPO/perf/torch_ref.py" --data "$PACK/data" --json "$OUT/torch_ref.json"

say "examples on the GPU"
run 150 "$PACK/bin/mlp" --data "$PACK/data" --devices cuda:0 --chunk 256 --epochs 10 --json "$OUT/mlp_gpu.json"
run 150 "$PACK/bin/mlp" --data "$PACK/data" --devices vgpu:64,16,16,16 --hidden 2048,2048 --batch 8192 --chunk 256 --epochs 1 --compare
run 200 "$PACK/bin/cnn" --data "$PACK/data" --devices cuda:0 --chunk 64 --json "$OUT/cnn_gpu.json"

say "6. stealbench: 16 and 32 simulated devices on $(nproc) cores (no GPU)"
for n in 16 32; do  # 256 samples per device, as in the README's tables
  run 120 "$PACK/bin/stealbench" --scenario seed-slow,seed-skew,hetero,varcost,slowdown --policy static,lbbsp,steal-adaptive \
    --devices "$n" --batch $((n * 256)) --overhead --json "$OUT/stealbench$n.json" 2>/dev/null
done

say "summary"
python3 "$REPO/perf/device_check_summary.py" "$OUT" || fails=$((fails + 1))
say "done: $fails failed step(s) or target(s)"
[ "$fails" -eq 0 ]

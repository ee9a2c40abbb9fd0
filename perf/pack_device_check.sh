#!/usr/bin/env bash
# Builds what perf/device_check.sh runs and packs it into .devpack/ (ignored by git; carry it to the GPU machine):
# the GPU binaries (sm_90, static cudart) and stealbench, the shared libraries that machine lacks (libtbb,
# oneDNN with its OpenMP and OpenCL loader, xz-packed to fit the transfer limit), the static stealbatch libraries
# that the libtorch adapter's check links there against that machine's PyTorch (perf/device_torch/) with the CLI11
# headers its command line is parsed with, and Fashion-MNIST. NCCL and cuBLAS come from that machine's pip packages.
#
#   bash perf/pack_device_check.sh [BUILD_DIR]      (default build-device/: Release, CUDA on, MPI off)
#
# MPI is off in that build: the GPU machine has no Open MPI, and a binary linked with it would not start there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-device}
PACK=.devpack
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEALBATCH_CUDA=ON -DSTEALBATCH_MPI=OFF
fi
ninja -C "$BUILD" gpu_check test_cuda_basics test_cuda_runtime mlp cnn stealbench stealbatch_cuda stealbatch_runtime stealbatch_checkpoint stealbatch_scheduler
rm -rf "$PACK" && mkdir -p "$PACK/bin" "$PACK/lib" "$PACK/data" "$PACK/static" "$PACK/include"
for lib in cuda runtime checkpoint scheduler; do cp "$BUILD/$lib/libstealbatch_$lib.a" "$PACK/static/"; done
cp -r /usr/include/CLI "$PACK/include/"  # Debian's libcli11-dev, header only: the GPU machine has no CLI11
cp "$BUILD/perf/gpu_check" "$BUILD/tests/cuda/test_cuda_basics" "$BUILD/tests/cuda/test_cuda_runtime" "$BUILD/examples/mlp" "$BUILD/examples/cnn" "$BUILD/perf/stealbench" "$PACK/bin/"
for lib in libtbb.so.12 libdnnl.so.2 libgomp.so.1 libOpenCL.so.1; do
  path=$(ldd "$PACK/bin/gpu_check" | awk -v l="$lib" '$1 == l {print $3}')
  [ -n "$path" ] || { echo "pack: $lib not found in ldd of gpu_check" >&2; exit 1; }
  xz -T2 -6 -c "$path" > "$PACK/lib/$lib.xz"
done
# Nothing packed may need a library the GPU machine lacks and the pack does not carry (Open MPI above all).
for bin in "$PACK"/bin/*; do
  if ldd "$bin" | grep -q "libmpi"; then
    echo "pack: $bin links Open MPI, which the GPU machine lacks: pack from a build with -DSTEALBATCH_MPI=OFF" >&2
    exit 1
  fi
done
cp /usr/share/datasets/fashion-mnist/*.gz "$PACK/data/"
du -sh "$PACK"

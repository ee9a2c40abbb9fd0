#!/usr/bin/env bash
# The device check's libtorch build (perf/device_torch), rehearsed here: configured and built against Debian's CPU
# libtorch and this build's static stealbatch libraries, as the GPU machine builds it against its PyTorch and the pack.
# That machine has no Boost and no TBB headers, so the compile's include closure (ninja's deps log, what the compiler
# read) must hold no Boost or TBB header; nor CLI11 from anywhere but the pack. The program must then start and say
# that it sees no GPU.
# Usage: device_torch_build.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/pack/static" "$work/pack/include"
for lib in cuda runtime checkpoint scheduler; do ln -s "$build/$lib/libstealbatch_$lib.a" "$work/pack/static/"; done
cp -r /usr/include/CLI "$work/pack/include/"  # as perf/pack_device_check.sh packs it
libs="$(dirname "$(ldconfig -p | awk '/libtbb.so.12 /{print $NF; exit}')");/usr/local/cuda/lib64"
start=$SECONDS
cmake -S "$src/perf/device_torch" -B "$work/build" -G Ninja -DSB_CPU_REHEARSAL=ON -DSB_PACK="$work/pack" -DSB_LIBS="$libs" \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { tail -60 "$work/build.log"; exit 1; }
echo "device_torch: configured and built in $((SECONDS - start)) s"
ninja -C "$work/build" -t deps > "$work/deps.txt"
n=$(grep -c "stealbatch/" "$work/deps.txt" || true)
t=$(grep -c "torch/" "$work/deps.txt" || true)
[ "$n" -gt 0 ] && [ "$t" -gt 0 ] || { echo "the deps log names no stealbatch or torch header ($n, $t): the closure check would prove nothing"; exit 1; }
if grep -E "/(boost|tbb|oneapi/tbb)/" "$work/deps.txt" | sort -u > "$work/private.txt" && [ -s "$work/private.txt" ]; then
  echo "the device's libtorch build reads Boost or TBB headers, which the GPU machine lacks:"
  head -20 "$work/private.txt"
  exit 1
fi
c=$(grep -c "$work/pack/include/CLI/" "$work/deps.txt" || true)
if [ "$c" -eq 0 ] || grep -q "/usr/include/CLI/" "$work/deps.txt"; then
  echo "the device's libtorch build reads CLI11 from outside the pack ($c reads from the pack), which the GPU machine would not have"
  exit 1
fi
echo "device_torch: include closure of $n stealbatch, $t torch and $c CLI11 (packed) header reads, none of Boost or TBB"
set +e
out=$("$work/build/torch_gpu_check" --json "$work/t.json" 2>&1)
rc=$?
set -e
echo "$out" | tail -3
[ $rc -ne 0 ] && echo "$out" | grep -q "torch sees no GPU" || { echo "torch_gpu_check did not start and report that it sees no GPU (rc $rc)"; exit 1; }
echo "device_torch: PASS"

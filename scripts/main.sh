#!/usr/bin/env bash
# The main job: install what is missing, build (Release, CUDA on when nvcc is there), and run the uneven-load
# demonstrations, each with a static split (the DDP baseline) and with stealing, side by side, from the same weights:
# - the imbalance of real data: torch_lm, a byte-level transformer on 512 Python standard library documents in
#   length-grouped batches, on two CPU devices of equal speed (about a minute; needs libtorch, which setup installs);
# - the imbalance of uneven devices: the MLP on Fashion-MNIST on four CPU devices, two of them 6.6x slower.
# Extra arguments go to the mlp example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --parallel "$(nproc)"
mkdir -p results
if [ -x build/examples/torch_lm ]; then
  ./build/examples/torch_lm --compare --compare-policies static,steal --devices cpu:2 --order grouped --limit 512 --epochs 1 \
    --cache results/pystdlib.corpus --json results/torch_lm_compare.json
  echo
fi
./build/examples/mlp --compare --devices cpu:4 --slowdown 6.6,6.6,1,1 --epochs 1 --json results/mlp_compare.json "$@"

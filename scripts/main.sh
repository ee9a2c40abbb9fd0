#!/usr/bin/env bash
# The main job: install what is missing, build (Release, CUDA on when nvcc is there), and run the uneven-load
# demonstration: the MLP on Fashion-MNIST on four CPU devices, two of them 6.6x slower, with a static split
# (the DDP baseline) and with stealing, side by side. Extra arguments go to the mlp example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --parallel "$(nproc)"
mkdir -p results
./build/examples/mlp --compare --devices cpu:4 --slowdown 6.6,6.6,1,1 --epochs 1 --json results/mlp_compare.json "$@"

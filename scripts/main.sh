#!/usr/bin/env bash
# The main job: install what is missing, build (Release, CUDA on when nvcc is there), and run the demonstration.
# Until the MLP example lands, the demonstration is dequebench: the chunk deque against its peers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --parallel "$(nproc)"
mkdir -p results
./build/perf/dequebench --json results/dequebench.json "$@"

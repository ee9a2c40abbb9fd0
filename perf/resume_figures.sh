#!/usr/bin/env bash
# The resume figures of perf/README.md ("Checkpoints"): the mlp example on cpu:2, full data, 3 epochs, seed 1,
# straight against 1 epoch with --save and --stop-after 1 and then a new process with --resume for the other 2.
# Static placement with fixed chunks: the final parameters compared bit for bit (also from a mid-epoch checkpoint).
# Stealing with automatic chunks: the largest parameter difference against the straight run, beside the one
# between two straight runs, and the test accuracies.
#
#   bash perf/resume_figures.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
mlp=${1:-build}/examples/mlp
cmp=tests/checkpoint/compare_checkpoints.py
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "# resume figures: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
data=(--epochs 3 --devices cpu:2 --seed 1)
accuracy() { sed -n 's/^test accuracy //p' "$1" | tail -1; }
newest() { ls "$1" | grep '^step-' | tail -1; }

static=("${data[@]}" --policy static --chunk 64)
"$mlp" "${static[@]}" --save "$dir/straight" --save-every 25 --keep 100 >"$dir/straight.txt" 2>/dev/null
"$mlp" "${static[@]}" --save "$dir/cut" --stop-after 1 >/dev/null 2>&1
"$mlp" "${static[@]}" --resume "$dir/cut" --save "$dir/cut" >"$dir/resumed.txt" 2>/dev/null
last=$(newest "$dir/straight")
echo "static, chunk 64: resumed after epoch 1 against straight ($last): $(python3 "$cmp" "$dir/straight/$last" "$dir/cut/$last" --bitwise)"
mkdir "$dir/mid" && cp "$dir/straight/step-000000000075.safetensors" "$dir/mid/"
"$mlp" "${static[@]}" --resume "$dir/mid" --save "$dir/mid" >/dev/null 2>&1
echo "static, chunk 64: resumed from step 75 against straight: $(python3 "$cmp" "$dir/straight/$last" "$dir/mid/$last" --bitwise)"
echo "static accuracy: straight $(accuracy "$dir/straight.txt"), resumed $(accuracy "$dir/resumed.txt")"

"$mlp" "${data[@]}" --save "$dir/s1" >"$dir/s1.txt" 2>/dev/null
"$mlp" "${data[@]}" --save "$dir/s2" >"$dir/s2.txt" 2>/dev/null
"$mlp" "${data[@]}" --save "$dir/sc" --stop-after 1 >/dev/null 2>&1
"$mlp" "${data[@]}" --resume "$dir/sc" --save "$dir/sc" >"$dir/sr.txt" 2>/dev/null
last=$(newest "$dir/s1")
echo "steal, chunk auto: resumed against straight: $(python3 "$cmp" "$dir/s1/$last" "$dir/sc/$last")"
echo "steal, chunk auto: straight against straight: $(python3 "$cmp" "$dir/s1/$last" "$dir/s2/$last")"
echo "steal accuracy: straight $(accuracy "$dir/s1.txt"), straight again $(accuracy "$dir/s2.txt"), resumed $(accuracy "$dir/sr.txt")"

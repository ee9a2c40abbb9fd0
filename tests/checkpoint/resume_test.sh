#!/usr/bin/env bash
# A run interrupted and resumed equals one that was not. The mlp example trains 3 epochs straight, then 1 epoch
# with --save, a new process --resume's it for the other 2 (and one resumes from a mid-epoch checkpoint), with the
# same seed: with a static placement and fixed chunks the final parameters are bit-identical; with stealing
# (automatic chunks), which reorders the gradient sums, the test accuracies agree within 0.002.
#
#   bash tests/checkpoint/resume_test.sh build/examples/mlp
set -euo pipefail
mlp=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
data=(--limit 12000 --epochs 3 --devices cpu:2)
accuracy() { sed -n 's/^test accuracy //p' "$1" | tail -1; }

static=("${data[@]}" --policy static --chunk 64)
"$mlp" "${static[@]}" --save "$dir/straight" --save-every 5 --keep 100 >"$dir/straight.txt" 2>/dev/null
"$mlp" "${static[@]}" --save "$dir/cut" --stop-after 1 >/dev/null 2>&1
"$mlp" "${static[@]}" --resume "$dir/cut" --save "$dir/cut" >"$dir/resumed.txt" 2>/dev/null
grep '^# resumed from' "$dir/resumed.txt"
last=$(ls "$dir/straight" | tail -1)
python3 "$here/compare_checkpoints.py" "$dir/straight/$last" "$dir/cut/$last" --bitwise
# From a checkpoint in the middle of epoch 2 (step 20; 12 steps an epoch).
mkdir "$dir/mid" && cp "$dir/straight/step-000000000020.safetensors" "$dir/mid/"
"$mlp" "${static[@]}" --resume "$dir/mid" --save "$dir/mid" >"$dir/mid.txt" 2>/dev/null
grep '^# resumed from' "$dir/mid.txt"
python3 "$here/compare_checkpoints.py" "$dir/straight/$last" "$dir/mid/$last" --bitwise

"$mlp" "${data[@]}" >"$dir/steal_straight.txt" 2>/dev/null
"$mlp" "${data[@]}" --save "$dir/steal" --stop-after 1 >/dev/null 2>&1
"$mlp" "${data[@]}" --resume "$dir/steal" >"$dir/steal_resumed.txt" 2>/dev/null
a=$(accuracy "$dir/steal_straight.txt") b=$(accuracy "$dir/steal_resumed.txt")
echo "stealing: test accuracy straight $a, resumed $b"
python3 -c "import sys; d = abs($a - $b); print(f'difference {d:.4f} (at most 0.002)'); sys.exit(0 if d <= 0.002 else 1)"

# A resume that does not fit this run: a clear error, status 2, nothing trained.
if "$mlp" "${data[@]}" --resume "$dir/steal" --batch 512 >"$dir/bad.txt" 2>&1; then echo "a resume with another --batch ran"; exit 1; fi
grep -q "saved with --batch 1024, this run has 512" "$dir/bad.txt"
if "$mlp" "${data[@]}" --resume "$dir/steal" --hidden 64 >"$dir/bad2.txt" 2>&1; then echo "a resume into another model ran"; exit 1; fi
grep -q "bad checkpoint" "$dir/bad2.txt"
echo "resume: all checks passed"

# checkpoint: save and load times (fsync included), resume against an uninterrupted run, the kill test, and PyTorch
# reading a checkpoint (with TORCH_PYTHON and safetensors).
section_checkpoint() {
  dir=$(mktemp -d)  # not local: the EXIT trap reads it after the function returns
  trap 'rm -rf "$dir"' EXIT
  checkpoint_times | tee "$out/checkpoint_times.txt"
  bash tests/checkpoint/kill_test.sh "$build/tests/checkpoint/save_loop" 50 | tee "$out/kill_test.txt"
  resume_figures | tee "$out/resume_figures.txt"
  if [ -n "${TORCH_PYTHON:-}" ] && "$TORCH_PYTHON" -c "import safetensors" 2>/dev/null; then
    : >"$out/checkpoint_interop.txt"
    for m in "mlp 10" "cnn 4"; do
      set -- $m
      python3 perf/checkpoint_interop.py --torch-python "$TORCH_PYTHON" --build "$build" --model "$1" --epochs "$2" | tee -a "$out/checkpoint_interop.txt"
    done
  else
    echo "PyTorch reading a checkpoint: skipped (TORCH_PYTHON with safetensors installed)"
  fi
}

# mlp and cnn train with a checkpoint after every step (the median over those saves), then 5 processes each --resume
# from the newest (the median load, as the "# resumed" line reports it: read, checks, crc32, copy into the runtime).
checkpoint_times() {
  echo "# checkpoint save and load, fsync included: $(machine), $(df -T "$dir" | awk 'NR==2 {print $2}') file system"
  printf '%-5s %10s %10s %6s %12s %12s\n' model parameters "file (MB)" saves "save p50 ms" "load p50 ms"
  for spec in "mlp --limit 30720" "cnn --limit 3200"; do
    set -- $spec
    local model=$1 loads=()
    shift
    local to="$dir/$model"
    "$build/examples/$model" --devices cpu:2 --epochs 2 "$@" --save "$to" --save-every 1 --keep 2 --json "$dir/$model.json" >/dev/null 2>&1
    for _ in 1 2 3 4 5; do
      loads+=("$("$build/examples/$model" --devices cpu:2 --epochs 3 "$@" --resume "$to" --stop-after 1 2>/dev/null | sed -n 's/.*(loaded in \([0-9.]*\) ms).*/\1/p')")
    done
    python3 - "$dir/$model.json" "$model" "$to/$(ls "$to" | tail -1)" "${loads[@]}" <<'PY'
import json, math, os, statistics, struct, sys
saves = json.load(open(sys.argv[1]))["runs"][0]["checkpoint_save_seconds"]
model, path, loads = sys.argv[2], sys.argv[3], [float(x) for x in sys.argv[4:]]
with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
params = sum(math.prod(e["shape"]) for n, e in header.items() if n != "__metadata__" and not n.startswith("optimizer."))
print(f"{model:<5} {params:>10} {os.path.getsize(path) / 1e6:>10.2f} {len(saves):>6} {statistics.median(saves) * 1e3:>12.2f} {statistics.median(loads):>12.2f}")
PY
  done
}

# The mlp example on cpu:2, full data, 3 epochs, seed 1, straight against 1 epoch with --save and --stop-after 1 and
# then a new process with --resume for the other 2. Static placement with fixed chunks: the final parameters compared
# bit for bit (also from a mid-epoch checkpoint). Stealing with automatic chunks: the largest parameter difference
# against the straight run, beside the one between two straight runs, and the test accuracies.
resume_figures() {
  local mlp="$build/examples/mlp" cmp=tests/checkpoint/compare_checkpoints.py last
  local data=(--epochs 3 --devices cpu:2 --seed 1)
  local static=("${data[@]}" --policy static --chunk 64)
  accuracy() { sed -n 's/^test accuracy //p' "$1" | tail -1; }
  newest() { ls "$1" | grep '^step-' | tail -1; }
  echo "# resume figures: $(machine)"
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
}

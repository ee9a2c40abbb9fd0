#!/usr/bin/env bash
# Save and load times of the examples' checkpoints, fsync included: mlp and cnn train with a checkpoint after every
# step (the median over those saves), then 5 processes each --resume from the newest (the median load, as the
# "# resumed" line reports it: read, checks, crc32, copy into the runtime).
#
#   bash perf/checkpoint_times.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "# checkpoint save and load, fsync included; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(df -T "$dir" | awk 'NR==2 {print $2}') file system"
printf '%-5s %10s %10s %6s %12s %12s\n' model parameters "file (MB)" saves "save p50 ms" "load p50 ms"
for spec in "mlp --limit 30720" "cnn --limit 3200"; do
  set -- $spec
  model=$1; shift
  out="$dir/$model"
  "$build/examples/$model" --devices cpu:2 --epochs 2 "$@" --save "$out" --save-every 1 --keep 2 --json "$dir/$model.json" >/dev/null 2>&1
  latest=$(ls "$out" | tail -1)
  loads=()
  for _ in 1 2 3 4 5; do
    loads+=("$("$build/examples/$model" --devices cpu:2 --epochs 3 "$@" --resume "$out" --stop-after 1 2>/dev/null | sed -n 's/.*(loaded in \([0-9.]*\) ms).*/\1/p')")
  done
  python3 - "$dir/$model.json" "$model" "$out/$latest" "${loads[@]}" <<'PY'
import json, math, os, statistics, struct, sys
run = json.load(open(sys.argv[1]))["runs"][0]
saves = run["checkpoint_save_seconds"]
model, path, loads = sys.argv[2], sys.argv[3], [float(x) for x in sys.argv[4:]]
with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
params = sum(math.prod(e["shape"]) for n, e in header.items() if n != "__metadata__" and not n.startswith("optimizer."))
print(f"{model:<5} {params:>10} {os.path.getsize(path) / 1e6:>10.2f} {len(saves):>6} {statistics.median(saves) * 1e3:>12.2f} {statistics.median(loads):>12.2f}")
PY
done

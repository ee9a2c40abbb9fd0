#!/usr/bin/env bash
# The main job's headline, measured without bias: ROUNDS interleaved rounds (default 7) of
#   mlp --compare --devices cpu:4 --slowdown 6.6,6.6,1,1 --epochs 1     (what scripts/main.sh runs)
#   mlp --compare --devices cpu:4 --slowdown 6.6,6.6,1,1 --epochs 4     (the steady state: median of 4 epochs each)
# and, where OLD_MLP names another build's mlp, its one-epoch --compare in the same rounds. Prints every round, then
# the medians: speedup, static and steal epoch, each device's utilization under each policy, and the ideal for the
# emulated speeds, Σs / (n · min s) = 3.8x.
#
#   bash perf/main_job_rounds.sh [BUILD_DIR] [ROUNDS]        OLD_MLP=/path/to/mlp bash perf/main_job_rounds.sh
set -euo pipefail
build=${1:-build}/examples
rounds=${2:-7}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "# main job rounds: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F)"
job=(--compare --devices cpu:4 --slowdown 6.6,6.6,1,1)
for round in $(seq 1 "$rounds"); do
  "$build/mlp" "${job[@]}" --epochs 1 --json "$work/one.$round.json" >/dev/null 2>&1
  "$build/mlp" "${job[@]}" --epochs 4 --json "$work/four.$round.json" >/dev/null 2>&1
  if [ -n "${OLD_MLP:-}" ]; then "$OLD_MLP" "${job[@]}" --epochs 1 --json "$work/old.$round.json" >/dev/null 2>&1; fi
  echo "round $round done"
done
python3 - "$work" "$rounds" <<'PY'
import glob, json, os, statistics as st, sys
work, rounds = sys.argv[1], int(sys.argv[2])
speeds = [1 / 6.6, 1 / 6.6, 1, 1]
ideal = sum(speeds) / (len(speeds) * min(speeds))
for kind, what in (("one", "--epochs 1 (the main job)"), ("four", "--epochs 4 (steady state, median epoch)"), ("old", "--epochs 1, OLD_MLP")):
    files = sorted(glob.glob(os.path.join(work, f"{kind}.*.json")))
    if not files:
        continue
    ratio, static, steal, ustatic, usteal = [], [], [], [], []
    for f in files:
        j = json.load(open(f))
        a, b = j["runs"]
        ratio.append(j["speedup_steal_vs_static"])
        static.append(st.median(a["epoch_seconds"]))
        steal.append(st.median(b["epoch_seconds"]))
        ustatic.append(a["utilization"])
        usteal.append(b["utilization"])
    med = lambda rows: ", ".join(f"{st.median(r[d] for r in rows):.2f}" for d in range(len(rows[0])))
    print(f"{what}: {len(files)} rounds, speedup median {st.median(ratio):.2f}x (runs {min(ratio):.2f}-{max(ratio):.2f}x), "
          f"static {st.median(static):.3f} s, steal {st.median(steal):.3f} s per epoch; utilization static [{med(ustatic)}], steal [{med(usteal)}]")
print(f"ideal for the emulated speeds: {ideal:.2f}x")
PY

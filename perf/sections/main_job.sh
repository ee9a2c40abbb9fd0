# main_job: what scripts/main.sh runs, once, then ROUNDS interleaved rounds (default 7) of it and of its steady state,
# with the medians: speedup, each policy's epoch, each device's utilization, and the ideal for the emulated speeds,
# Σs / (n · min s). BASELINE_MLP=/path/to/mlp adds another build's one-epoch run to every round.
#   mlp --compare --devices cpu:4 --slowdown 6.6,6.6,1,1 --epochs 1     the main job
#   mlp --compare --devices cpu:4 --slowdown 6.6,6.6,1,1 --epochs 4     the steady state: the median of 4 epochs each
section_main_job() {
  local job=(--compare --devices cpu:4 --slowdown 6.6,6.6,1,1) rounds=${ROUNDS:-7} dir="$out/main_job_rounds"
  "$build/examples/mlp" "${job[@]}" --epochs 1 --json "$out/mlp_compare.json" 2>/dev/null | tee "$out/main_job.txt"
  rm -rf "$dir" && mkdir -p "$dir"
  {
    echo "# main job, $rounds interleaved rounds: $(machine)"
    for round in $(seq 1 "$rounds"); do
      "$build/examples/mlp" "${job[@]}" --epochs 1 --json "$dir/one.$round.json" >/dev/null 2>&1
      "$build/examples/mlp" "${job[@]}" --epochs 4 --json "$dir/four.$round.json" >/dev/null 2>&1
      [ -z "${BASELINE_MLP:-}" ] || "$BASELINE_MLP" "${job[@]}" --epochs 1 --json "$dir/baseline.$round.json" >/dev/null 2>&1
      echo "round $round done"
    done
    python3 - "$dir" <<'PY'
import glob, json, os, statistics as st, sys
speeds = [1 / 6.6, 1 / 6.6, 1, 1]
for kind, what in (("one", "--epochs 1 (the main job)"), ("four", "--epochs 4 (steady state, median epoch)"), ("baseline", "--epochs 1, BASELINE_MLP")):
    files = sorted(glob.glob(os.path.join(sys.argv[1], f"{kind}.*.json")))
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
print(f"ideal for the emulated speeds, sum(s) / (n min(s)): {sum(speeds) / (len(speeds) * min(speeds)):.2f}x")
PY
  } | tee "$out/main_job_rounds.txt"
}

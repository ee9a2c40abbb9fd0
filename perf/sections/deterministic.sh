# deterministic: what --deterministic costs and what it promises, on Fashion-MNIST.
#   - The cost: ROUNDS interleaved rounds (default 5) of each job with and without it, samples/s over its epochs
#     (the examples' --json), and the ratio of the medians; for the MLP, the CNN, the libtorch MLP and the main job.
#   - The promise: the parameters' SHA-256 after one epoch of the MLP on cpu:1, cpu:2, cpu:4 with two devices slowed
#     6.6x, static and steal, and (an MPI build) on 2 ranks: one hash; and the default mode's hashes beside them.
#   - The reduction across 2 ranks: the dashboard's allreduce time with and without (int64 sums: twice the bytes).
#   - The accuracy bars with --deterministic, the MLP and the CNN in their default epochs.
section_deterministic() {
  local ex="$build/examples" rounds=${ROUNDS:-5} dir="$out/deterministic"
  rm -rf "$dir" && mkdir -p "$dir"
  {
    echo "# deterministic mode: $(machine)"
    local jobs=("mlp|mlp --devices cpu:2 --epochs 3" "cnn|cnn --devices cpu:2 --epochs 2 --limit 20000"
                "main_job|mlp --devices cpu:4 --slowdown 6.6,6.6,1,1 --policy steal --epochs 3")
    [ -x "$ex/torch_mlp" ] && jobs+=("torch_mlp|torch_mlp --devices cpu:2 --epochs 3")
    local j name cmd round mode
    for round in $(seq 1 "$rounds"); do
      for j in "${jobs[@]}"; do
        name=${j%%|*} cmd=${j#*|}
        for mode in default deterministic; do
          local flag=()
          [ "$mode" = default ] || flag=(--deterministic)
          # shellcheck disable=SC2086
          "$ex/"$cmd "${flag[@]}" --json "$dir/$name.$mode.$round.json" >/dev/null 2>&1
        done
      done
      echo "round $round done"
    done
    python3 - "$dir" <<'PY'
import glob, json, os, statistics as st, sys
d = sys.argv[1]
print(f"{'job':<10} {'default':>12} {'determ.':>12} {'ratio':>7}  (samples/s over the epochs, median of the rounds; the ratio of the medians, and its range over rounds)")
for name in ("mlp", "cnn", "torch_mlp", "main_job"):
    runs = {}
    for mode in ("default", "deterministic"):
        runs[mode] = [json.load(open(f))["runs"][0] for f in sorted(glob.glob(os.path.join(d, f"{name}.{mode}.*.json")))]
    if not runs["default"]:
        continue
    sps = {m: [r["samples_per_s"] for r in runs[m]] for m in runs}
    ratios = [b / a for a, b in zip(sps["default"], sps["deterministic"])]
    print(f"{name:<10} {st.median(sps['default']):>12.0f} {st.median(sps['deterministic']):>12.0f} {st.median(sps['deterministic']) / st.median(sps['default']):>6.2f}x"
          f"  (rounds {min(ratios):.2f}-{max(ratios):.2f}x; accuracy {st.median(r['test_accuracy'] for r in runs['default']):.4f} / "
          f"{st.median(r['test_accuracy'] for r in runs['deterministic']):.4f})")
PY
    echo
    echo "# the accuracy bars (mlp 0.88, cnn 0.91) with --deterministic, default epochs, cpu:2:"
    for e in mlp cnn; do
      printf '  %s: ' "$e"
      "$ex/$e" --devices cpu:2 --deterministic 2>/dev/null | sed -n 's/^test accuracy //p'
    done
    echo
    echo "# parameters sha256 after 1 epoch of mlp (--limit 20000 --batch 256 --chunk 32):"
    local base=(--epochs 1 --limit 20000 --batch 256 --chunk 32) sha='s/^parameters sha256 \([0-9a-f]*\).*/\1/p'
    for cfg in "cpu:1 static" "cpu:2 steal" "cpu:4 steal --slowdown 6.6,6.6,1,1" "cpu:4 static --slowdown 6.6,6.6,1,1"; do
      set -- $cfg
      local d x
      d=$("$ex/mlp" "${base[@]}" --devices "$1" --policy "$2" "${@:3}" --deterministic 2>/dev/null | sed -n "$sha")
      x=$("$ex/mlp" "${base[@]}" --devices "$1" --policy "$2" "${@:3}" 2>/dev/null | sed -n "$sha")
      printf '  %-40s deterministic %s   default %s\n' "$cfg" "$d" "$x"
    done
    if command -v mpirun >/dev/null && [ -x "$ex/mlp" ]; then
      local two
      two=$("${mpi[@]}" -np 2 "$ex/mlp" "${base[@]}" --devices cpu:1 --policy steal --deterministic 2>/dev/null | sed -n "$sha" | head -1)
      printf '  %-40s deterministic %s\n' "2 MPI ranks x cpu:1 steal" "$two"
      echo
      echo "# the reduction across 2 ranks (mlp, 1 epoch, the dashboard's allreduce seconds; median of 3 each, interleaved):"
      local ar='s/^| time: chunks [0-9.]* s, allreduce \([0-9.]*\) s.*/\1/p' a=() b=()
      for _ in 1 2 3; do
        a+=("$("${mpi[@]}" -np 2 "$ex/mlp" "${base[@]}" --devices cpu:1 2>/dev/null | sed -n "$ar" | head -1)")
        b+=("$("${mpi[@]}" -np 2 "$ex/mlp" "${base[@]}" --devices cpu:1 --deterministic 2>/dev/null | sed -n "$ar" | head -1)")
      done
      python3 -c "
import statistics as s, sys
a, b = [float(x) for x in sys.argv[1:4]], [float(x) for x in sys.argv[4:7]]
print(f'  default {s.median(a):.3f} s, deterministic {s.median(b):.3f} s: {s.median(b) / s.median(a):.2f}x')" "${a[@]}" "${b[@]}"
    fi
  } | tee "$out/deterministic.txt"
}

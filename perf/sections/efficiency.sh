# efficiency: samples/s against chunk size, each fixed --chunk and --chunk auto interleaved, 3 runs each: mlp and cnn on
# cpu:2 (drawn into perf/charts/efficiency_curve_*.svg where matplotlib is installed), and the main job.
section_efficiency() {
  local mlp_svg=() cnn_svg=()
  if python3 -c "import matplotlib" 2>/dev/null; then
    mlp_svg=(--svg perf/charts/efficiency_curve_mlp.svg) cnn_svg=(--svg perf/charts/efficiency_curve_cnn.svg)
  else
    echo "no matplotlib (python3-matplotlib): the curves are measured, not drawn"
  fi
  python3 perf/efficiency_curve.py --build "$build" --runs 3 --json "$out/efficiency_mlp.json" "${mlp_svg[@]}" | tee "$out/efficiency_mlp.txt"
  python3 perf/efficiency_curve.py --build "$build" --example cnn --runs 3 --chunks 4,8,16,32,64 --epochs 3 --json "$out/efficiency_cnn.json" \
    "${cnn_svg[@]}" -- --limit 20000 | tee "$out/efficiency_cnn.txt"
  python3 perf/efficiency_curve.py --build "$build" --devices cpu:4 --runs 3 --chunks 32,64,128,256 --json "$out/efficiency_mainjob.json" \
    -- --slowdown 6.6,6.6,1,1 | tee "$out/efficiency_mainjob.txt"
}

# kernels: gemmbench, OpenBLAS as it detects itself, then with its core named (SkylakeX).
section_kernels() {
  "$build/perf/gemmbench" --json "$out/gemmbench.json" | tee "$out/gemmbench.txt"
  OPENBLAS_CORETYPE=SkylakeX "$build/perf/gemmbench" --libs openblas | tee "$out/gemmbench_skylakex.txt"
}

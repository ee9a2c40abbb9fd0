# soak: 180 s of random runtimes and injected faults, every step checked.
section_soak() {
  "$build/perf/soak" --seconds 180 --json "$out/soak.json" 2>/dev/null | tee "$out/soak.txt"
}

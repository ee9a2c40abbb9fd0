# deque: the chunk deque against its peers (dequebench), and the runtime's cost per chunk with empty chunk functions
# (stealbench --chunk-overhead) on cpu:2 (steal, static) and cpu:4 (steal), and its cost per step with one chunk a step
# (--chunks 1) on cpu:1 and cpu:2.
section_deque() {
  "$build/perf/dequebench" --json "$out/dequebench.json" | tee "$out/dequebench.txt"
  : >"$out/chunk_overhead.txt"
  for spec in "cpu:2 steal" "cpu:2 static" "cpu:4 steal"; do
    set -- $spec
    "$build/perf/stealbench" --chunk-overhead --devices "$1" --policy "$2" | tee -a "$out/chunk_overhead.txt"
  done
  for devices in cpu:1 cpu:2; do
    "$build/perf/stealbench" --chunk-overhead --devices "$devices" --chunks 1 --steps 2000 | tee -a "$out/chunk_overhead.txt"
  done
}

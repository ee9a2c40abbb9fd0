# charts: the stealbench sweeps behind perf/charts/, drawn by perf/plotting.py (matplotlib): efficiency against
# devices (the scale sweep), chunk size against efficiency and step time (hetero, 4 devices), per-device utilization
# (static against steal-adaptive on the seed scenarios), and one step of every policy as a timeline (seed-slow).
section_charts() {
  python3 -c "import matplotlib" 2>/dev/null || skip "no matplotlib (python3-matplotlib)"
  local raw="$out/charts" to=perf/charts
  rm -rf "$raw" && mkdir -p "$raw/traces" "$to"
  "$build/perf/stealbench" --scenario scale --policy static,lbbsp,central,steal,steal-adaptive --json "$raw/scale.json" >/dev/null 2>&1
  python3 perf/plotting.py lines "$raw/scale.json" --x devices --y efficiency --logx \
    --title "hetero (1, 0.8, 0.5, 0.25 repeated), weak scaling, 1.6 ms chunks (time-scale 20)" --out "$to/efficiency_vs_devices.svg"
  local c
  for c in 2 4 8 16 32 64 128; do
    "$build/perf/stealbench" --scenario hetero --policy steal,steal-adaptive --chunk "$c" --time-scale 4 --steps 12 --json "$raw/chunk$c.json" >/dev/null 2>&1
  done
  python3 perf/plotting.py lines "$raw"/chunk{2,4,8,16,32,64,128}.json --x chunk --y efficiency --y2 step_ms_median --logx --mark 16 \
    --title "hetero, 4 devices, batch 1024: chunk size against efficiency and step time" --out "$to/chunk_size.svg"
  "$build/perf/stealbench" --scenario seed-slow,seed-skew --policy all --steps 10 --json "$raw/seed.json" --trace-dir "$raw/traces" >/dev/null 2>&1
  python3 perf/plotting.py util "$raw/seed.json" --title "per-device utilization, 4 simulated devices (median of 10 steps)" \
    --out "$to/utilization.svg"
  python3 perf/plotting.py gantt "$raw/traces" --scenario seed-slow --devices 4 \
    --title "seed-slow (devices 0 and 1 6.6x slower): one step of each policy" --out "$to/gantt_seed_slow.svg"
  echo "wrote $to/efficiency_vs_devices.svg $to/chunk_size.svg $to/utilization.svg $to/gantt_seed_slow.svg (raw rows in $raw/)"
}

# stealbench: the runtime on simulated devices, every scenario at 4 devices (every policy, with --overhead), at 16 and
# 32 (static, lbbsp, steal-adaptive), the scale sweep (hetero at 4 to 64 devices); then the tail model of varcost.
section_stealbench() {
  local scenarios=seed-slow,seed-skew,hetero,varcost,slowdown
  "$build/perf/stealbench" --scenario "$scenarios" --overhead --json "$out/sb4.json" 2>/dev/null | tee "$out/sb4.txt"
  for n in 16 32; do
    "$build/perf/stealbench" --scenario "$scenarios" --policy static,lbbsp,steal-adaptive --devices "$n" --batch $((n * 256)) --overhead \
      --json "$out/sb$n.json" 2>/dev/null | tee "$out/sb$n.txt"
  done
  "$build/perf/stealbench" --scenario scale --policy static,lbbsp,central,steal,steal-adaptive --overhead --json "$out/sb_scale.json" 2>/dev/null \
    | tee "$out/sb_scale.txt"
  python3 perf/tail_model.py | tee "$out/tail_model.txt"
}

#!/usr/bin/env bash
# Runs the stealbench sweeps behind perf/README.md's charts and draws them into perf/charts/ (SVG).
# Usage: perf/stealbench_charts.sh [BUILD_DIR]   (a few minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=perf/charts
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
"$build/perf/stealbench" --scenario scale --policy static,lbbsp,central,steal,steal-adaptive --json "$tmp/scale.json" >/dev/null 2>&1
python3 perf/plotting.py lines "$tmp/scale.json" --x devices --y efficiency --logx \
  --title "hetero (1, 0.8, 0.5, 0.25 repeated), weak scaling, 1.6 ms chunks (time-scale 20)" --out "$out/efficiency_vs_devices.svg"
# The tail-versus-overhead curve: chunk size against efficiency and step time, hetero on 4 devices.
for c in 2 4 8 16 32 64 128; do
  "$build/perf/stealbench" --scenario hetero --policy steal,steal-adaptive --chunk "$c" --time-scale 4 --steps 12 --json "$tmp/c$c.json" >/dev/null 2>&1
done
python3 perf/plotting.py lines "$tmp"/c{2,4,8,16,32,64,128}.json --x chunk --y efficiency --y2 step_ms_median --logx --mark 16 \
  --title "hetero, 4 devices, batch 1024: chunk size against efficiency and step time" --out "$out/chunk_size.svg"
# The dashboard picture: per-device utilization, static against steal-adaptive, on the two seed scenarios; and one
# step of every policy as a timeline (seed-slow, 4 devices).
mkdir -p "$tmp/traces"
"$build/perf/stealbench" --scenario seed-slow,seed-skew --policy all --steps 10 --json "$tmp/seed.json" --trace-dir "$tmp/traces" >/dev/null 2>&1
python3 perf/plotting.py util "$tmp/seed.json" --title "per-device utilization, 4 simulated devices (median of 10 steps)" \
  --out "$out/utilization.svg"
python3 perf/plotting.py gantt "$tmp/traces" --scenario seed-slow --devices 4 \
  --title "seed-slow (devices 0 and 1 6.6x slower): one step of each policy" --out "$out/gantt_seed_slow.svg"
echo "wrote $out/efficiency_vs_devices.svg $out/chunk_size.svg $out/utilization.svg $out/gantt_seed_slow.svg"

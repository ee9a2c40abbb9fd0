#!/usr/bin/env bash
# The libtorch adapter's figures, side by side: torch_mlp and torch_cnn on cpu:2 against the same module with plain
# libtorch on 2 threads (3 interleaved runs each, samples/s over the median epoch after the first), and the main job's
# slowdown with --compare for torch_mlp and, for reference, the hand-written mlp (7 interleaved rounds, with and without
# merged steals), and the accuracy of the default runs.
#
#   bash perf/torch_adapter_figures.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}/examples
echo "# libtorch adapter: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
sps() { sed -n 's/.*), \([0-9]*\) samples\/s.*/\1/p' | head -1; }
plain() { sed -n 's/^plain libtorch, [0-9]* threads: \([0-9]*\) samples\/s.*/\1/p'; }
for spec in "torch_mlp 3" "torch_cnn 2"; do
  set -- $spec
  ours=() theirs=()
  for _ in 1 2 3; do
    ours+=("$("$build/$1" --devices cpu:2 --epochs "$2" 2>/dev/null | sps)")
    theirs+=("$("$build/$1" --plain --plain-threads 2 --epochs "$2" 2>/dev/null | plain)")
  done
  echo "$1 cpu:2, $2 epochs: adapter ${ours[*]}, plain libtorch ${theirs[*]}" \
    "-> median ratio $(python3 -c "import statistics as s, sys; a = [float(x) for x in sys.argv[1:4]]; b = [float(x) for x in sys.argv[4:]]; print(f'{s.median(a) / s.median(b):.2f}x')" "${ours[@]}" "${theirs[@]}")"
done
# The main job's slowdown, 7 interleaved rounds (single runs on 2 vCPUs vary by a third): each example with thieves
# merging what they steal (the default) and without, then the medians.
# Each device's utilization under the steal policy is read from the same runs' dashboards.
ratio() { sed -n 's/^steal vs static: \([0-9.]*\)x.*/\1/p'; }
utils() { awk '/policy steal/ { s = 1 } s && /^\| cpu[0-9]/ { sub(/%/, "", $3); printf "%s%s", sep, $3; sep = "," }'; }
declare -A runs util
for round in 1 2 3 4 5 6 7; do
  for ex in torch_mlp mlp; do
    for merge in on off; do
      out=$("$build/$ex" --compare --devices cpu:4 --slowdown 6.6,6.6,1,1 --epochs 1 --merge-stolen "$merge" 2>/dev/null)
      r=$(ratio <<<"$out")
      u=$(utils <<<"$out")
      runs[$ex.$merge]+="$r "
      util[$ex.$merge]+="$u "
      echo "round $round: $ex --merge-stolen $merge: steal ${r}x faster than static, utilization % $u"
    done
  done
done
for key in torch_mlp.on torch_mlp.off mlp.on mlp.off; do
  python3 -c "
import statistics as s, sys
v = sorted(float(x) for x in sys.argv[2].split())
u = [[int(x) for x in run.split(',')] for run in sys.argv[3].split()]
m = s.median(v)
per = ', '.join(f'cpu{d} {s.median(run[d] for run in u) / 100:.2f}' for d in range(len(u[0])))
print(f'{sys.argv[1]}: median {m:.2f}x (steal/static {1 / m:.3f}), range {v[0]:.2f}-{v[-1]:.2f}x over {len(v)} runs; median utilization {per}')
" "$key" "${runs[$key]}" "${util[$key]}"
done
# Accuracy after the default epochs, from the hand-written models' starts.
for ex in torch_mlp torch_cnn; do
  printf '%s --devices cpu:2, default epochs: ' "$ex"
  "$build/$ex" --devices cpu:2 2>/dev/null | sed -n 's/^test accuracy //p'
done

#!/usr/bin/env bash
# perf/cluster_model.py against the step times measured with it (perf/cluster_model_measured.txt): every gated row
# within 10%. Then the same file with one measured step made 30% longer, which the validation must reject: the check
# can fail.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
model="$root/perf/cluster_model.py" measured="$root/perf/cluster_model_measured.txt"
python3 "$model" --validate "$measured" || { echo "FAIL: the model is off by more than 10% on a gated row"; exit 1; }
grep -q "^measured .* gate 1" "$measured" || { echo "FAIL: no gated row in $measured"; exit 1; }
bent=$(mktemp)
trap 'rm -f "$bent"' EXIT
awk '!done && /^measured .* gate 1/ { for (i = 1; i < NF; i++) if ($i == "step_ms") $(i + 1) = $(i + 1) * 1.3; done = 1 } { print }' "$measured" >"$bent"
if python3 "$model" --validate "$bent" >/dev/null; then
  echo "FAIL: a measured step 30% longer still passed the validation"
  exit 1
fi
# The scale run at 100 ranks: it runs, and with the bounds the step is no longer than without them (RDMA costs).
out=$(python3 "$model" --scale --budget --inputs "$measured" --scale-ranks 100 --scale-scenarios hetero) || { echo "FAIL: --scale"; exit 1; }
echo "$out"
echo "$out" | awk '$1 == "RDMA" && $5 == "unbounded" { before = $6 } $1 == "RDMA" && $5 == "bounded" { bounded = $6 }
  END { if (!(bounded > 0 && bounded <= before)) { print "FAIL: the bounded step is not at most the unbounded one"; exit 1 } }' || exit 1
echo "PASS"

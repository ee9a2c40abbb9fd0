#!/usr/bin/env bash
# torch_lm, short: a tiny model for a few steps on the Python standard library's documents, every policy of its
# --compare (static, packer, steal without and with costs) on cpu:2, grouped and then with a slowdown; its report
# (tokens/s, the ideal's share, bits per byte against the unigram bar); --deterministic's one hash; the export for
# the PyTorch peer; and its answers to bad flags and data (the README's exit codes).
#   torch_lm_short.sh TORCH_LM
set -euo pipefail
lm=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [ -f "$work/log" ] && cat "$work/log"; exit 1; }
small=(--limit 48 --batch 16 --epochs 1 --max-len 96 --width 32 --layers 1 --validation-docs 16 --cache "$work/corpus")
tiny=("${small[@]}" --heads 2)

"$lm" "${tiny[@]}" --devices cpu:2 --order grouped --compare --json "$work/c.json" >"$work/log" 2>&1 || fail "exit $? on the --compare run"
for p in static packer steal-nocosts steal; do
  grep -q "^+-- policy $p:" "$work/log" || fail "no dashboard for $p"
done
grep -q "^steal vs static: " "$work/log" || fail "no headline"
grep -q "^# document cost: b L + e L^2" "$work/log" || fail "no fitted cost"
python3 - "$work/c.json" <<'EOF' || fail "the JSON report"
import json, sys
j = json.load(open(sys.argv[1]))
runs = {r["policy"]: r for r in j["runs"]}
assert set(runs) == {"static", "packer", "steal-nocosts", "steal"}, runs.keys()
for p, r in runs.items():
    assert r["units"] == "tokens" and r["units_per_s"] > 0, (p, r["units"], r["units_per_s"])
    assert 0 < r["ideal_fraction"] <= 1.0 + 1e-9, (p, r["ideal_fraction"])
    assert r["metric"] == "validation bits/byte" and 0 < r["test_accuracy"] < 9, (p, r["test_accuracy"])
    assert r["epoch_seconds"] and len(r["utilization"]) == 2, p
# The same batches from the same start: every policy computes the same gradients (to rounding), so the same model.
# (A chunk that trained on another chunk's documents moved the packer's figure by 3e-4 here.)
v = [r["test_accuracy"] for r in runs.values()]
assert max(v) - min(v) < 1e-4, v
print("report ok:", {p: round(r["test_accuracy"], 4) for p, r in runs.items()})
EOF
grep -q "^# unigram model on the same split: [0-9.]* bits/byte" "$work/log" || fail "no unigram bar"

# With device 0 at half speed, padded, costs as tokens: the same report.
"$lm" "${tiny[@]}" --devices cpu:2 --slowdown 2,1 --form padded --costs tokens --policy steal >"$work/log" 2>&1 || fail "exit $? on the padded run"
grep -q "^+-- policy steal:" "$work/log" || fail "no dashboard (padded)"

# --deterministic: variable-length documents cut into cells by their token counts, the same parameters on one device
# static and on two stealing with a slowdown.
det_hash() { "$lm" "${tiny[@]}" --deterministic "$@" 2>&1 | tee "$work/log" | sed -n 's/^parameters sha256 \([0-9a-f]\{64\}\).*/\1/p'; }
one=$(det_hash --devices cpu:1 --policy static --order grouped) || fail "exit $? on --deterministic, cpu:1"
two=$(det_hash --devices cpu:2 --policy steal --slowdown 2,1 --order grouped) || fail "exit $? on --deterministic, cpu:2"
[ -n "$one" ] && [ "$one" = "$two" ] || fail "--deterministic: cpu:1 static '$one', cpu:2 steal '$two'"
echo "deterministic: one hash $one"

# The export for perf/torch_lm_ref.py: the settings, the documents and each epoch's order over them.
"$lm" "${tiny[@]}" --export "$work/run.json" >"$work/log" 2>&1 || fail "exit $? on --export"
python3 - "$work/run.json" <<'EOF' || fail "the export"
import json, sys
r = json.load(open(sys.argv[1]))
assert len(r["train"]) == 48 and len(r["validation"]) == 16, (len(r["train"]), len(r["validation"]))
assert all(1 <= len(d) <= 96 for d in r["train"])
assert len(r["orders"]) == 1 and sorted(r["orders"][0]) == list(range(48))
assert r["model"] == {"width": 32, "layers": 1, "heads": 2, "max_len": 96} and r["batch"] == 16
EOF

# Bad flags and data: 2 for a configuration error, 3 for data, each naming the problem, before training.
expect() {
  local code=$1 text=$2
  shift 2
  set +e
  "$lm" "$@" >"$work/log" 2>&1
  local rc=$?
  set -e
  [ "$rc" = "$code" ] || fail "exit $rc (wanted $code) for $*"
  grep -q -- "$text" "$work/log" || fail "no '$text' for $*"
}
expect 2 "not a divisor of --width" "${small[@]}" --heads 3
expect 2 "--order" "${tiny[@]}" --order sorted
mkdir -p "$work/empty"
expect 3 "bad data" "${tiny[@]}" --data "$work/empty"
expect 2 "costs model with --deterministic" "${tiny[@]}" --deterministic --costs model
echo "torch_lm short: ok"

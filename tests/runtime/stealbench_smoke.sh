#!/usr/bin/env bash
# A short stealbench run: every chunk exactly once, and stealing beats the static split on seed-slow. Samples of
# 50 us (time-scale 10): at 10 us, another test on the same two cores could push steal steps onto 4 ms timer ticks.
set -euo pipefail
bench=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$bench" --scenario seed-slow,hetero --policy static,steal,steal-adaptive --steps 6 --warmup 2 --batch 512 --time-scale 10 --json "$out"
python3 - "$out" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
wrong = sum(r["wrong"] for r in rows)
ms = {(r["scenario"], r["policy"]): r["step_ms_median"] for r in rows}
print(f"rows {len(rows)}, wrong {wrong}, seed-slow static {ms[('seed-slow','static')]:.2f} ms, steal {ms[('seed-slow','steal')]:.2f} ms")
assert wrong == 0, "chunks not run exactly once"
assert ms[("seed-slow", "steal")] < ms[("seed-slow", "static")] / 1.5, "steal does not beat static on seed-slow"
assert ms[("seed-slow", "steal-adaptive")] < ms[("seed-slow", "static")] / 1.5, "steal-adaptive does not beat static on seed-slow"
PY

#!/usr/bin/env bash
# --compare on one device, where static and steal do the same work with the same chunks: the two must read the same
# within noise. Each policy is warmed up before anything is timed and the two alternate epoch by epoch, so neither
# pays what the other does not (the first steps in a process, a machine whose load drifts); the check is the median
# of the epoch pairs' ratios (each static epoch beside the steal epoch after it), which a shift in the machine's load
# in mid-run moves far less than it moves the ratio of the median epochs that --compare reports. Run serially.
# And no run beats its ideal: on cpu:1, and on sim:1, whose chunks in flight end each step with a drain.
# Usage: compare_one_device.sh MLP
set -uo pipefail
mlp=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import gzip, os, struct, sys
root, n = sys.argv[1], 15000
def write(name, header, body):
    with gzip.open(os.path.join(root, name), "wb", compresslevel=1) as f:
        f.write(header + body)
write("train-images-idx3-ubyte.gz", struct.pack(">IIII", 0x803, n, 28, 28), os.urandom(n * 784))
write("train-labels-idx1-ubyte.gz", struct.pack(">II", 0x801, n), bytes(b % 10 for b in os.urandom(n)))
write("t10k-images-idx3-ubyte.gz", struct.pack(">IIII", 0x803, 500, 28, 28), os.urandom(500 * 784))
write("t10k-labels-idx1-ubyte.gz", struct.pack(">II", 0x801, 500), bytes(b % 10 for b in os.urandom(500)))
PY
"$mlp" --data "$work" --compare --devices cpu:1 --chunk 128 --epochs 7 --json "$work/out.json" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
"$mlp" --data "$work" --devices sim:1 --chunk 128 --epochs 1 --limit 4096 --json "$work/sim.json" >"$work/sim.log" 2>&1 || { cat "$work/sim.log"; exit 1; }
grep "steal vs static" "$work/log"
python3 - "$work/out.json" "$work/sim.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for path, devices in zip(sys.argv[1:], ("cpu:1", "sim:1")):
    for r in json.load(open(path))["runs"]:
        print(f"{devices} {r['policy']}: {r['ideal_fraction']:.3f} of the ideal")
        if not 0 < r["ideal_fraction"] <= 1.0 + 1e-9:
            sys.exit(f"FAIL: {devices} {r['policy']} reads {r['ideal_fraction']} of the ideal: its steps beat their ideal")
static, steal = (r["epoch_seconds"] for r in j["runs"])
ratio = j["speedup_steal_vs_static"]
median = lambda v: sorted(v)[len(v) // 2]  # the examples' median: the upper middle
paired = median([a / b for a, b in zip(static, steal)])
print(f"epochs: static {[round(x, 3) for x in static]}, steal {[round(x, 3) for x in steal]}; ratio of medians {ratio:.3f}, "
      f"median of the pairs' ratios {paired:.3f}")
# The ratio of medians on 2 vCPUs (AMD EPYC), 20 runs: 0.90 to 1.11; once 0.84, when both policies' last epochs ran
# 40% slower (the pairs' median then 0.99).
if not 0.85 <= paired <= 1.18:
    sys.exit(f"FAIL: one device reads {paired:.2f}x (the median of the epoch pairs' ratios), outside [0.85, 1.18]")
if abs(median(static) / median(steal) - ratio) > 1e-9:
    sys.exit("FAIL: the speedup is not the ratio of the median epochs")
print("compare_one_device: PASS")
PY

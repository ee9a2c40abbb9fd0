#!/usr/bin/env bash
# The device check rehearsed without a GPU, with a pack of stand-in binaries:
#   1. every GPU step fails fast: every step still runs within the deadline, $OUT holds the three files that come
#      back (at most 8, at most two folders down, is the device tool's limit), device_check.json parses and names
#      every missing figure with its reason (the step's first error line);
#   1b. gpu_check's throughput sections and torch_ref.py (stand-ins) write figures: each row against PyTorch is judged
#      against the fastest PyTorch peer that ran and agrees with eager (eager, one CUDA graph, torch.compile), names
#      it, and leaves out a peer whose loss disagrees or that did not run, saying why;
#   2. one GPU test hangs: the run cuts that step at the deadline, skips every later step with a line that says so,
#      still prints the summary naming each missing figure, and exits non-zero, all within the deadline;
#   3. a run stopped by SIGTERM, or by SIGTERM to its whole process group, prints its summary at once.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export DEVICE_CHECK_SCRATCH="$WORK/scratch"
mkdir -p "$WORK/pack/bin" "$WORK/pack/lib" "$WORK/pack/data"
for b in test_cuda_basics test_cuda_runtime mlp cnn stealbench gpu_check; do printf '#!/bin/sh\necho "%s: no GPU here"\nexit 1\n' "$b" > "$WORK/pack/bin/$b"; done
chmod +x "$WORK/pack/bin/"*
fail() { echo "rehearsal: FAIL: $*"; sed 's/^/  | /' "$WORK/out/device_check.log" 2>/dev/null | tail -60; exit 1; }

# The log's tee may still be writing its last lines when the script exits: wait for its final line (10 s at most).
wait_for_log() { for _ in $(seq 100); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# What comes back from the device machine: at most 8 files, at most two folders down; this check writes 3.
check_out() {
  local n deep
  n=$(find "$WORK/out" -type f | wc -l)
  deep=$(find "$WORK/out" -mindepth 4 | wc -l)
  [ "$n" -le 8 ] || fail "\$OUT holds $n files; at most 8 come back: $(find "$WORK/out" -type f | tr '\n' ' ')"
  [ "$deep" -eq 0 ] || fail "\$OUT has entries more than two folders down"
  for f in device_check.log steps.tsv device_check.json; do [ -s "$WORK/out/$f" ] || fail "no $f in \$OUT"; done
  [ "$n" -eq 3 ] || fail "\$OUT holds $n files, not the 3 expected: $(find "$WORK/out" -type f | tr '\n' ' ')"
}
# device_check.json is strict JSON, and names every missing figure with a reason that contains $1.
check_json() {
  python3 - "$WORK/out/device_check.json" "$1" "${@:2}" <<'PY' || fail "device_check.json: see above"
import json, sys
path, needle, expected = sys.argv[1], sys.argv[2], sys.argv[3:]
def strict(c):
    raise ValueError(f"not strict JSON: {c}")
j = json.load(open(path), parse_constant=strict)
missing = {m["check"]: m["reason"] for m in j["missing"]}
for check in expected:
    hits = [c for c in missing if check in c]
    if not hits:
        sys.exit(f"device_check.json does not name '{check}' as missing (missing: {sorted(missing)})")
    for c in hits:
        if not missing[c] or needle not in missing[c]:
            sys.exit(f"'{c}' is missing with reason '{missing[c]}', which does not say '{needle}'")
for row in j["rows"]:
    if row["figure"].startswith("missing") and not row["reason"]:
        sys.exit(f"row '{row['check']}' is missing with no reason")
print(f"rehearsal: device_check.json parses: {len(j['rows'])} rows, {len(missing)} missing figures, each with its reason")
PY
}
ROWS=("mlp GPU vs CPU gradient" "cnn GPU vs CPU gradient" "mlp samples/s vs the best PyTorch peer" "cnn samples/s vs the best PyTorch peer"
      "wide mlp 784-2048-2048-10 samples/s vs the best PyTorch peer" "vgpu static/steal/ideal" "NCCL allreduce" "curve"
      "mlp example on cuda:0" "mlp example on cuda:0 with --gpu-graphs on --gpu-data device" "cnn example on cuda:0" "checkpoint cuda:0 -> cpu:2" "checkpoint cpu:2 -> cuda:0" "torch_mlp adapter on cuda:0"
      "torch_cnn adapter on cuda:0" "torch_lm adapter on cuda:0 and vgpu parts" "torch_lm 256 documents on vgpu parts" "python mlp on cuda:0" "stealbench 16 devices" "stealbench 32 devices"
      "deterministic: one sha256 on cuda:0 and vgpu parts")
STEPS=(test_cuda_basics test_cuda_runtime gpu_check:equivalence-mlp gpu_check:equivalence-cnn gpu_check:throughput-mlp gpu_check:throughput-cnn
       gpu_check:vgpu gpu_check:curve gpu_check:reduce gpu_check:deterministic torch_ref mlp_cuda mlp_cuda_graphs mlp_vgpu cnn_cuda ckpt_gpu_cpu ckpt_cpu_gpu ckpt_straight_cpu
       ckpt_straight_gpu torch_build torch_gpu_check python_build python_gpu_check stealbench16 stealbench32)

# 1. Every GPU step fails fast: every step runs, and the reasons are the steps' own first error lines.
start=$(date +%s)
OUT="$WORK/out" DEVICE_CHECK_DEADLINE_S=120 DEVICE_CHECK_MIN_STEP_S=2 bash "$REPO/perf/device_check.sh" "$WORK/pack" > "$WORK/stdout" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
wait_for_log "] done:" "$WORK/out/device_check.log" || fail "no summary"
echo "rehearsal: every step failing fast: device_check.sh exited $rc after $took s (deadline 120 s)"
[ $rc -ne 0 ] || fail "exit status 0 although every step failed"
[ $took -le 120 ] || fail "took $took s: the deadline did not hold"
for s in "${STEPS[@]}"; do
  grep -q -P "^\Q$s\E\t(exit|timed out|not run)" "$WORK/out/steps.tsv" || fail "step $s did not run and fail (steps.tsv: $(grep -P "^\Q$s\E\t" "$WORK/out/steps.tsv"))"
done
grep -q -P "^gpu_check:vgpu\texit 1\t[0-9]+\tgpu_check: no GPU here" "$WORK/out/steps.tsv" || fail "steps.tsv lacks gpu_check:vgpu's first error line"
check_out
check_json "no GPU here" "mlp GPU vs CPU gradient" "cnn GPU vs CPU gradient" "vgpu static/steal/ideal" "mlp example on cuda:0" "stealbench 16 devices"
check_json "" "${ROWS[@]}"
rm -rf "$WORK/out"

# 1b. Stand-in figures for the rows against PyTorch: ours from gpu_check's throughput sections, the PyTorch peers from
# a stand-in torch_ref.py (as the real one writes them: mlp's best peer the CUDA graph; cnn's graph faster still but its
# loss disagrees with eager's, so compile is the best; the wide MLP's compile peer not built, and no figure of ours).
cp "$WORK/pack/bin/gpu_check" "$WORK/gpu_check.fails"
cat > "$WORK/pack/bin/gpu_check" <<'SH'
#!/bin/sh
section= json=
while [ $# -gt 0 ]; do case $1 in --section) section=$2; shift ;; --json) json=$2; shift ;; esac; shift; done
case $section in
  throughput-mlp) echo '{"throughput": {"mlp": {"batch": 256, "samples_per_s": 800000, "samples_per_s_block": 700000, "samples_per_s_auto": 806000, "auto_chunk": 96, "samples_per_s_graphs": 1400000}}}' > "$json" ;;
  throughput-cnn) echo '{"throughput": {"cnn": {"batch": 256, "samples_per_s": 310000, "samples_per_s_block": 300000, "samples_per_s_auto": 320000, "auto_chunk": 128}}}' > "$json" ;;
  *) echo "gpu_check: no GPU here"; exit 1 ;;
esac
echo "gpu_check: $section (stand-in figures)"
SH
cat > "$WORK/torch_ref_stand_in.py" <<'PY'
import argparse, json
ap = argparse.ArgumentParser()
ap.add_argument("mode")
ap.add_argument("--json")
ap.add_argument("--budget-s", type=float)
a, _ = ap.parse_known_args()
assert a.mode == "gpu" and a.budget_s, "device_check.sh runs torch_ref.py gpu with --budget-s"
def peer(sps, loss=2.22, diff=0.0):
    return {"samples_per_s": sps, "samples_per_s_runs": [sps] * 3, "step_ms_median": 1.0, "setup_s": 1.0, "loss_after_warmup": loss,
            "loss_rel_diff_vs_eager": diff, "agrees": diff <= 1e-3}
models = {
    "mlp": {"batch": 256, "peers": {"eager_host": peer(160000), "eager": peer(175000), "graph": peer(1320000), "compile": peer(900000)}},
    "cnn": {"batch": 256, "peers": {"eager_host": peer(158000), "eager": peer(138000), "graph": peer(2000000, 2.30, 0.036),
                                    "compile": peer(300000)}},
    "wide": {"batch": 16384, "peers": {"eager": peer(1470000), "graph": peer(1480000)}},
}
out = {"mode": "gpu", "torch": "stand-in", "peers_asked": ["eager_host", "eager", "graph", "compile"], "models": models,
       "errors": {"wide.compile": "not built: 80 s of --budget-s 75 used before it"}}
json.dump(out, open(a.json, "w"))
print("torch_ref stand-in: wide compile: not built")
raise SystemExit(1)
PY
start=$(date +%s)
OUT="$WORK/out" DEVICE_CHECK_DEADLINE_S=120 DEVICE_CHECK_MIN_STEP_S=2 DEVICE_CHECK_TORCH_REF="$WORK/torch_ref_stand_in.py" \
  bash "$REPO/perf/device_check.sh" "$WORK/pack" > "$WORK/stdout" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
wait_for_log "] done:" "$WORK/out/device_check.log" || fail "no summary"
echo "rehearsal: stand-in figures against the PyTorch peers: device_check.sh exited $rc after $took s (deadline 120 s)"
[ $rc -ne 0 ] || fail "exit status 0 although steps failed"
[ $took -le 120 ] || fail "took $took s: the deadline did not hold"
grep -q -P "^gpu_check:throughput-mlp\tok\t" "$WORK/out/steps.tsv" || fail "the stand-in gpu_check:throughput-mlp did not pass"
grep -q -P "^torch_ref\texit 1\t[0-9]+\ttorch_ref stand-in: wide compile: not built" "$WORK/out/steps.tsv" || fail "steps.tsv lacks torch_ref's exit and first line"
grep -q -E "^mlp samples/s \(chunk auto: 96\) vs the best PyTorch peer +806000 vs 1320000 \(graph\) = 0\.61x" "$WORK/out/device_check.log" ||
  fail "the summary table does not judge mlp against the CUDA-graph peer, by name"
check_out
python3 - "$WORK/out/device_check.json" <<'PY' || fail "device_check.json: the rows against PyTorch, see above"
import json, sys
j = json.load(open(sys.argv[1]))
rows = {r["check"]: r for r in j["rows"]}
def row(prefix):
    hits = [r for c, r in rows.items() if c.startswith(prefix)]
    if len(hits) != 1:
        sys.exit(f"{len(hits)} rows start with '{prefix}': {sorted(rows)}")
    return hits[0]
def expect(r, **want):
    for k, v in want.items():
        got = r.get(k)
        if (abs(got - v) > 1e-9 * abs(v)) if isinstance(v, float) and isinstance(got, (int, float)) else got != v:
            sys.exit(f"row '{r['check']}': {k} is {got!r}, not {v!r} (row: {r})")
expect(row("mlp samples/s (chunk auto: 96) vs the best PyTorch peer"), peer="graph", verdict="FAIL", ratio=806000 / 1320000, peer_samples_per_s=1320000)
expect(row("cnn samples/s (chunk auto: 128) vs the best PyTorch peer"), peer="compile", verdict="PASS", ratio=320000 / 300000)
expect(row("PyTorch peers for mlp:"), verdict="PASS")
expect(row("mlp with gpu.graphs vs the best PyTorch peer"), peer="graph", verdict="PASS", ratio=1400000 / 1320000)
expect(row("mlp chunk 256 replayed from CUDA graphs"), verdict="n/a")
if any(c.startswith("cnn with gpu.graphs") for c in rows):
    sys.exit("a cnn gpu.graphs row without a gpu.graphs figure")
cnn_peers = row("PyTorch peers for cnn:")
expect(cnn_peers, verdict="FAIL")
if "graph" not in cnn_peers["reason"] or "differs from eager" not in cnn_peers["reason"] or "graph" in cnn_peers["peers"]:
    sys.exit(f"the cnn peers row does not leave graph out for its loss: {cnn_peers}")
wide = row("wide mlp 784-2048-2048-10 samples/s vs the best PyTorch peer")
expect(wide, peer="graph", verdict="FAIL")
if not wide["figure"].startswith("missing") or "throughput.wide" not in wide["reason"]:
    sys.exit(f"the wide row does not say that our figure is missing, and why: {wide}")
wide_peers = row("PyTorch peers for wide mlp")
if wide_peers["verdict"] != "FAIL" or "compile" not in wide_peers["reason"] or "budget" not in wide_peers["reason"]:
    sys.exit(f"the wide peers row does not name the compile peer that was not built: {wide_peers}")
best = {m: (b or {}).get("peer") for m, b in j["torch_best_peers"].items()}
if best != {"mlp": "graph", "cnn": "compile", "wide": "graph"}:
    sys.exit(f"torch_best_peers is {best}")
print("rehearsal: each row against PyTorch is judged against its best peer, named: mlp graph, cnn compile (graph left out), wide graph")
PY
cp "$WORK/gpu_check.fails" "$WORK/pack/bin/gpu_check"
rm -rf "$WORK/out"

# 2. One GPU test hangs.
printf '#!/bin/sh\necho "test_cuda_runtime: hangs"\nexec sleep 1017\n' > "$WORK/pack/bin/test_cuda_runtime"
start=$(date +%s)
OUT="$WORK/out" DEVICE_CHECK_DEADLINE_S=12 DEVICE_CHECK_MIN_STEP_S=2 bash "$REPO/perf/device_check.sh" "$WORK/pack" > "$WORK/stdout" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
log="$WORK/out/device_check.log"
wait_for_log "] done:" "$log"
echo "rehearsal: device_check.sh exited $rc after $took s (deadline 12 s)"
[ $rc -ne 0 ] || fail "exit status 0 although every step failed"
[ $took -le 30 ] || fail "took $took s: the deadline did not hold"
grep -q "test_cuda_runtime timed out" "$log" || fail "the hanging step was not cut at the deadline"
for s in "${STEPS[@]:2}"; do
  [ "$s" = torch_build ] && continue  # started in the background before the GPU tests, and cut at the deadline
  [ "$s" = python_build ] && continue  # the same
  # torch_gpu_check is not run when its build did not finish
  grep -q -P "^\Q$s\E\t(skipped|not run)\t" "$WORK/out/steps.tsv" || fail "step $s was neither run nor reported as skipped"
done
grep -q "SKIPPED stealbench32:" "$log" || fail "no SKIPPED line in the log"
grep -q "== \[ *[0-9]*s\] summary" "$log" || fail "no summary"
for row in "${ROWS[@]}" "step test_cuda_basics"; do
  grep "$row" "$log" | grep -q -E "missing|exit|skipped" || fail "the summary does not name '$row' as missing"
done
check_out
check_json "" "${ROWS[@]}"

# A run killed from outside (SIGTERM, as a command limit would) still prints its summary, at once.
rm -rf "$WORK/out"
OUT="$WORK/out" DEVICE_CHECK_DEADLINE_S=120 bash "$REPO/perf/device_check.sh" "$WORK/pack" > "$WORK/stdout" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "test_cuda_runtime: hangs" "$WORK/out/device_check.log" 2>/dev/null && break; sleep 0.1; done
start=$(date +%s)
kill -TERM "$pid"
wait "$pid"
rc=$?
took=$(( $(date +%s) - start ))
wait_for_log "] done:" "$WORK/out/device_check.log"
echo "rehearsal: after SIGTERM, device_check.sh exited $rc in $took s"
[ $rc -ne 0 ] || fail "exit status 0 after SIGTERM"
[ $took -le 5 ] || fail "took $took s to stop after SIGTERM"
grep -q "interrupted by SIGTERM" "$WORK/out/device_check.log" || fail "no line for the signal"
grep -q "mlp GPU vs CPU gradient *missing" "$WORK/out/device_check.log" || fail "no summary after SIGTERM"
check_out

# A limit that signals the whole process group (as `timeout` and the device tool do) takes the log's tee along too:
# the summary must still reach the log.
rm -rf "$WORK/out"
OUT="$WORK/out" DEVICE_CHECK_DEADLINE_S=120 setsid bash "$REPO/perf/device_check.sh" "$WORK/pack" > "$WORK/stdout" 2>&1 &
leader=$!
for _ in $(seq 100); do grep -q "test_cuda_runtime: hangs" "$WORK/out/device_check.log" 2>/dev/null && break; sleep 0.1; done
kill -TERM -- "-$leader" 2>/dev/null
wait "$leader" 2>/dev/null
wait_for_log "] done:" "$WORK/out/device_check.log" || fail "no summary after SIGTERM to the process group"
grep -q "mlp GPU vs CPU gradient *missing" "$WORK/out/device_check.log" || fail "the summary lacks its rows after a group SIGTERM"
echo "rehearsal: after SIGTERM to the whole process group, the summary is in the log"

# The hanging stand-in must not outlive the runs.
for _ in $(seq 50); do pgrep -x -f "sleep 1017" >/dev/null || break; sleep 0.1; done
if pgrep -x -f "sleep 1017" >/dev/null; then
  pkill -x -f "sleep 1017"
  fail "the hanging step outlived the script"
fi
echo "rehearsal: PASS"

#!/usr/bin/env bash
# What a user can get wrong on the examples' command line and data, each answered with the README's exit status
# (2 configuration, 3 data, 4 checkpoint) and a message that names the problem, before any training where it can be
# known then; and nothing created that was not asked for.
# Usage: cli_errors.sh MLP CNN [TORCH_MLP [TORCH_LM]]      (MPIRUN=... adds the same codes on two ranks)
set -uo pipefail
mlp=$1 cnn=$2 torch_mlp=${3:-} torch_lm=${4:-}
read -r -a mpirun <<<"${MPIRUN:-}"
work=$(mktemp -d)
# An immutable folder (below) cannot be removed until the flag is cleared.
trap 'chattr -R -i "$work" 2>/dev/null; rm -rf "$work"' EXIT
fails=0

# Small synthetic Fashion-MNIST-shaped sets: train 28x28; test 28x28, 27x27 or 29x28.
python3 - "$work" <<'PY'
import gzip, os, random, struct, sys
root = sys.argv[1]
random.seed(5)
def images(path, n, rows, cols):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, rows, cols) + bytes(random.randrange(256) for _ in range(n * rows * cols)))
def labels(path, n):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(random.randrange(10) for _ in range(n)))
for name, (r, c) in {"good": (28, 28), "test27": (27, 27), "test29": (29, 28)}.items():
    d = os.path.join(root, name)
    os.makedirs(d)
    images(os.path.join(d, "train-images-idx3-ubyte.gz"), 512, 28, 28)
    labels(os.path.join(d, "train-labels-idx1-ubyte.gz"), 512)
    images(os.path.join(d, "t10k-images-idx3-ubyte.gz"), 64, r, c)
    labels(os.path.join(d, "t10k-labels-idx1-ubyte.gz"), 64)
# A gzip file whose CRC trailer does not match its data.
d = os.path.join(root, "badcrc")
os.makedirs(d)
for f in os.listdir(os.path.join(root, "good")):
    data = open(os.path.join(root, "good", f), "rb").read()
    if f.startswith("t10k-images"):
        data = data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:]
    open(os.path.join(d, f), "wb").write(data)
PY

# expect RC PATTERN -- COMMAND...: the command exits RC and its output matches PATTERN (grep -E), and trained nothing
# when RC is not 0 ("epoch 1/" never printed).
expect() {
  local want=$1 pattern=$2 rc out
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -q -E -- "$pattern" <<<"$out"; then
    echo "FAIL: $* exited $rc (want $want), output lacks /$pattern/:"
    sed 's/^/  | /' <<<"$out" | tail -8
    fails=$((fails + 1))
    return
  fi
  if [ "$want" -ne 0 ] && grep -q "epoch 1/" <<<"$out"; then
    echo "FAIL: $* trained before it failed:"
    sed 's/^/  | /' <<<"$out" | tail -8
    fails=$((fails + 1))
    return
  fi
  echo "ok: $want /$pattern/: ${*#"$mlp" }"
}

base=(--data "$work/good")
small=("${base[@]}" --epochs 1 --devices cpu:2)
# Data: every split must match the training set's images, before training (the CNN too).
expect 3 "test images are 27x27, the training images 28x28" -- "$mlp" --data "$work/test27" --epochs 1 --devices cpu:2
expect 3 "test images are 29x28" -- "$mlp" --data "$work/test29" --epochs 1 --devices cpu:2
expect 3 "test images are 27x27" -- "$cnn" --data "$work/test27" --epochs 1 --devices cpu:2
expect 3 "do not match its CRC" -- "$mlp" --data "$work/badcrc" --epochs 1 --devices cpu:2
# Usage errors exit 2, whatever CLI11's own code.
expect 2 "bogus" -- "$mlp" --bogus
expect 2 "epochs" -- "$mlp" --epochs abc
expect 2 "epochs" -- "$mlp" --epochs 0
expect 0 "Usage" -- "$mlp" --help
# Unsigned flags given a negative number are refused, not wrapped to 2^64 - 1.
for flag in --limit --seed --save-every --stop-after --keep --batch; do
  expect 2 "$flag: Value -1 not in range" -- "$mlp" "${small[@]}" "$flag" -1
done
# CUDA graphs are for GPU devices.
expect 2 "--gpu-graphs on: devices = 'cpu:2' are not GPUs" -- "$mlp" "${small[@]}" --gpu-graphs on
expect 2 "--gpu-data device: devices = 'cpu:2' are not GPUs" -- "$mlp" "${small[@]}" --gpu-data device
# Simulated speeds have a range.
expect 2 "simulated speeds must lie in" -- "$mlp" "${base[@]}" --devices sim:1e-9
expect 2 "simulated speeds must lie in" -- "$mlp" "${base[@]}" --devices sim:1,1e-300
# Paths: empty ones are refused, a missing resume folder is a checkpoint error and is not created, an unwritable
# --json is found before training.
expect 2 "empty path" -- "$mlp" "${small[@]}" --save ""
expect 2 "empty path" -- "$mlp" "${small[@]}" --resume ""
expect 4 "no such checkpoint folder" -- "$mlp" "${small[@]}" --resume "$work/nothing-here"
[ -e "$work/nothing-here" ] && { echo "FAIL: --resume created the folder it was to read"; fails=$((fails + 1)); }
mkdir "$work/empty"
expect 4 "no checkpoint" -- "$mlp" "${small[@]}" --resume "$work/empty"
expect 2 "json = .*cannot open it for writing" -- "$mlp" "${small[@]}" --json "$work/no-such-dir/out.json"
expect 2 "trace = .*no-such-dir/t.json'.*cannot open it for writing" -- "$mlp" "${small[@]}" --trace "$work/no-such-dir/t.json"
# A --json whose write fails at the end (a full disk) is an error, not a silent exit 0.
out=$("$mlp" "${small[@]}" --json /dev/full 2>&1)
rc=$?
if [ "$rc" -ne 1 ] || ! grep -q "writing --json file '/dev/full' failed: No space left on device" <<<"$out"; then
  echo "FAIL: --json /dev/full exited $rc (want 1, naming the failed write):"; sed 's/^/  | /' <<<"$out" | tail -4; fails=$((fails + 1))
else
  echo "ok: 1 /writing --json file '/dev/full' failed/"
fi
expect 2 "trace = .*no-such-dir/t.json.static.json'.*cannot open it for writing" -- "$mlp" "${small[@]}" --compare --trace "$work/no-such-dir/t.json"
# Numbers past their type's range are usage errors, not an abort; so are settings the runtime would refuse later, and
# flags that would be silently ignored.
expect 2 "--chunk: '99999999999999999999999': expected auto or a size in \[1, 1048576\]" -- "$mlp" "${small[@]}" --chunk 99999999999999999999999
expect 2 "--lr: Value 20 not in range" -- "$mlp" "${small[@]}" --lr 20
expect 2 "--compare-policies static,steal without --compare" -- "$mlp" "${small[@]}" --compare-policies static,steal
expect 2 "devices = 'sim:nan': simulated speeds must be finite numbers" -- "$mlp" "${base[@]}" --devices sim:nan
expect 2 "compare.*policy" -- "$mlp" "${small[@]}" --compare --policy static
expect 2 "packs each batch by its samples' costs, and this model gives none" -- "$mlp" "${small[@]}" --policy packer
expect 2 "compare-policies = 'steal': --compare needs two policies" -- "$mlp" "${small[@]}" --compare --compare-policies steal
expect 2 "policy = 'bogus'" -- "$mlp" "${small[@]}" --compare --compare-policies static,bogus
# A checkpoint folder has one owner: a second run with other flags does not save into it (unless asked to replace its
# checkpoints), --resume refuses another run's checkpoint naming what differs, and two live runs cannot share it.
ck=("${base[@]}" --batch 64 --devices cpu:2)
expect 0 "checkpoints: .* saved" -- "$mlp" "${ck[@]}" --epochs 2 --save "$work/ck"
expect 2 "holds .* checkpoint.*--save-overwrite" -- "$mlp" "${ck[@]}" --epochs 2 --lr 0.01 --save "$work/ck"
expect 2 "another run's checkpoint \(lr: 0.003 there, 0.01 here\)" -- "$mlp" "${ck[@]}" --epochs 2 --lr 0.01 --resume "$work/ck"
expect 0 "checkpoints: .* saved" -- "$mlp" "${ck[@]}" --epochs 2 --lr 0.01 --save "$work/ck" --save-overwrite
expect 0 "resumed from" -- "$mlp" "${ck[@]}" --epochs 3 --lr 0.01 --resume "$work/ck" --save "$work/ck"
# A finished run says so; --deterministic does not claim its bits from a checkpoint saved without it.
expect 2 "its run has trained 3 epoch\(s\), and --epochs is 3: nothing is left to run \(--epochs 4 or more" -- "$mlp" "${ck[@]}" --epochs 3 --lr 0.01 --resume "$work/ck"
expect 2 "saved by a run without --deterministic" -- "$mlp" "${ck[@]}" --epochs 4 --lr 0.01 --resume "$work/ck" --deterministic
# --save-overwrite never loses the checkpoint a run resumed from: a run that fails (a stall) before its next save
# leaves the folder as it was, and names the step it failed in as the run counts it (step 25 after 24).
before=$(ls "$work/ck")
expect 1 "made no progress for [0-9]+ ms in step 25 " -- "$mlp" "${ck[@]}" --epochs 4 --lr 0.01 --resume "$work/ck" --save "$work/ck" --save-overwrite \
  --slowdown 1000,1000 --stall-timeout 0.05
[ "$(ls "$work/ck")" = "$before" ] || { echo "FAIL: a failed resumed run with --save-overwrite changed its folder: '$before' -> '$(ls "$work/ck")'"; fails=$((fails + 1)); }
# Another run's checkpoints are replaced only once this run's first is written: a run that fails first leaves them,
# one that saves leaves only its own (its step 8 is not pruned in favour of their larger steps).
expect 1 "made no progress" -- "$mlp" "${ck[@]}" --epochs 1 --save "$work/ck" --save-overwrite --slowdown 1000,1000 --stall-timeout 0.05
[ "$(ls "$work/ck")" = "$before" ] || { echo "FAIL: a failed run with --save-overwrite removed another run's checkpoints"; fails=$((fails + 1)); }
expect 0 "checkpoints: 1 saved" -- "$mlp" "${ck[@]}" --epochs 1 --save "$work/ck" --save-overwrite
[ "$(ls "$work/ck")" = "step-000000000008.safetensors" ] || { echo "FAIL: --save-overwrite left '$(ls "$work/ck" | tr '\n' ' ')' (want this run's step 8 alone)"; fails=$((fails + 1)); }
# A save that cannot succeed (an immutable folder whose lock file exists) is found before any training.
mkdir "$work/frozen" && touch "$work/frozen/.lock"
if chattr +i "$work/frozen" 2>/dev/null; then
  expect 2 "save = .*frozen': cannot write checkpoints into .*frozen'" -- "$mlp" "${ck[@]}" --epochs 1 --save "$work/frozen"
  expect 2 "cannot write checkpoints into .*frozen'" -- "$mlp" "${ck[@]}" --epochs 1 --save "$work/frozen/sub/dir"
  chattr -i "$work/frozen"
else
  echo "note: chattr +i refused here; the immutable-folder case is left to the checkpoint folder's unit test"
fi
# --compare naming a policy twice: two runs, two dashboards, two trace files.
expect 0 "steal.2 vs static" -- "$mlp" "${ck[@]}" --epochs 1 --compare --compare-policies static,steal,steal --trace "$work/t.json"
for t in t.json.static.json t.json.steal.json t.json.steal.2.json; do
  [ -s "$work/$t" ] || { echo "FAIL: --compare --trace wrote no $t"; fails=$((fails + 1)); }
done
"$mlp" "${base[@]}" --epochs 1000 --batch 8 --devices cpu:1 --save "$work/live" > "$work/live.txt" 2>&1 &
live=$!
for _ in $(seq 200); do grep -q "epoch 1/" "$work/live.txt" 2>/dev/null && break; sleep 0.05; done
expect 4 "another live process \(pid $live\) is saving checkpoints into this folder" -- "$mlp" "${ck[@]}" --epochs 1 --save "$work/live"
kill "$live" 2>/dev/null; wait "$live" 2>/dev/null
# A run whose loss blows up says so, once.
expect 0 "training is diverging" -- "$mlp" "${ck[@]}" --epochs 2 --lr 10 --optimizer sgd --schedule constant
if [ -n "$torch_mlp" ]; then
  expect 2 "cpu:N" -- "$torch_mlp" "${base[@]}" --epochs 1 --plain --devices cpu:0
  # GPU devices with Debian's CPU-only libtorch: the true reason, not a build without CUDA.
  expect 2 "devices = 'cuda:all': this program's libtorch is CPU-only" -- "$torch_mlp" "${base[@]}" --epochs 1 --devices cuda:all
fi
lm_base=(--limit 16 --batch 8 --epochs 1 --width 16 --layers 1 --heads 2 --validation-docs 4 --devices cpu:1)
lm=("${lm_base[@]}" --max-len 64)
if [ -n "$torch_lm" ]; then
  expect 2 "--policy packer and --deterministic" -- "$torch_lm" "${lm[@]}" --policy packer --deterministic
fi
# Under mpirun each failure keeps its exit status across the ranks: a usage error, a data error, a checkpoint error.
if [ ${#mpirun[@]} -gt 0 ]; then
  expect 2 "epochs" -- "${mpirun[@]}" -np 2 "$mlp" --epochs 0
  expect 2 "mlp: bad configuration: .*save.*compare" -- "${mpirun[@]}" -np 2 "$mlp" "${base[@]}" --epochs 1 --compare --devices cpu:1 --save "$work/mpi-ck"
  expect 3 "test images are 27x27" -- "${mpirun[@]}" -np 2 "$mlp" --data "$work/test27" --epochs 1 --devices cpu:1
  expect 4 "no such checkpoint folder" -- "${mpirun[@]}" -np 2 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1 --resume "$work/nothing-here"
  # Ranks launched with different flags (an MPMD launch) are named before they could corrupt the job.
  expect 2 "disagree when they join on '--batch': rank 0 has 64, rank 1 has 32" -- "${mpirun[@]}" -np 1 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1 \
    --batch 64 : -np 1 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1 --batch 32
  expect 2 "disagree when they join on '--seed': rank 0 has 1, rank 1 has 2" -- "${mpirun[@]}" -np 1 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1 \
    : -np 1 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1 --seed 2
  expect 2 "disagree when they join on '--deterministic'" -- "${mpirun[@]}" -np 1 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1 --deterministic \
    : -np 1 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1
  expect 2 "disagree when they join on '--endgame': rank 0 has on, rank 1 has off" -- "${mpirun[@]}" -np 1 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1 \
    : -np 1 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1 --endgame off
  # One factor per device of this rank or of the whole job; anything else is named with both counts.
  expect 2 "slowdown has 3 values; expected one per device of this rank \(1\) or one per device of the whole job \(2, in rank order\)" -- \
    "${mpirun[@]}" -np 2 "$mlp" "${base[@]}" --epochs 1 --devices cpu:1 --slowdown 2,1,1
  if [ -n "$torch_lm" ]; then
    # The flags of torch_lm's own that shape what the ranks do together: named, before the cost fit's collective.
    expect 2 "disagree when they join on '--costs': rank 0 has model, rank 1 has tokens" -- "${mpirun[@]}" -np 1 "$torch_lm" "${lm[@]}" --costs model \
      : -np 1 "$torch_lm" "${lm[@]}" --costs tokens
    expect 2 "disagree when they join on '--order': rank 0 has grouped, rank 1 has shuffled" -- "${mpirun[@]}" -np 1 "$torch_lm" "${lm[@]}" \
      : -np 1 "$torch_lm" "${lm[@]}" --order shuffled
    expect 2 "disagree when they join on '--form': rank 0 has packed, rank 1 has padded" -- "${mpirun[@]}" -np 1 "$torch_lm" "${lm[@]}" \
      : -np 1 "$torch_lm" "${lm[@]}" --form padded
    expect 2 "disagree when they join on '--max-len': rank 0 has 64, rank 1 has 48" -- "${mpirun[@]}" -np 1 "$torch_lm" "${lm_base[@]}" --max-len 64 \
      : -np 1 "$torch_lm" "${lm_base[@]}" --max-len 48
  fi
  # A rank frozen mid-training (SIGSTOP, as a debugger or a stuck node would leave it) ends the job, naming it,
  # within --heartbeat-timeout plus a tenth of it, and mpirun's teardown.
  log="$work/stop.log"
  "${mpirun[@]}" -np 2 "$mlp" "${base[@]}" --epochs 1000 --devices cpu:1 --heartbeat-timeout 2 --save "$work/stop-ck" --save-every 1 --keep 1 >"$log" 2>&1 &
  job=$!
  victim=""
  for _ in $(seq 1 600); do  # training has started once rank 0 has saved a checkpoint
    if compgen -G "$work/stop-ck/step-*.safetensors" >/dev/null; then
      for pid in $(pgrep -f -- "$work/stop-ck"); do
        if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$pid; fi
      done
      [ -n "$victim" ] && break
    fi
    sleep 0.1
  done
  if [ -z "$victim" ]; then
    echo "FAIL: the two-rank run to freeze never started training:"; sed 's/^/  | /' "$log" | tail -8; fails=$((fails + 1))
    kill "$job" 2>/dev/null
  else
    stopped=$(date +%s.%N)
    kill -STOP "$victim"
    ( sleep 60; kill -KILL "$job" 2>/dev/null; kill -CONT "$victim" 2>/dev/null ) &
    guard=$!
    wait "$job"
    rc=$?
    took=$(awk -v a="$stopped" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    kill "$guard" 2>/dev/null
    kill -CONT "$victim" 2>/dev/null
    if [ "$rc" -eq 0 ] || ! grep -q -E "rank 1 \(node [^)]+\) stopped answering: no heartbeat for [0-9]+ ms \(heartbeat_timeout = 2 s" "$log" ||
       awk -v t="$took" 'BEGIN { exit !(t > 6) }'; then
      echo "FAIL: a frozen rank: exit status $rc after $took s (want non-zero within 6 s, naming rank 1):"; sed 's/^/  | /' "$log" | tail -8
      fails=$((fails + 1))
    else
      echo "ok: $rc /stopped answering/: a frozen rank ended the job $took s after SIGSTOP (--heartbeat-timeout 2)"
    fi
  fi
fi

if [ $fails -ne 0 ]; then echo "cli_errors: $fails case(s) failed"; exit 1; fi
echo "cli_errors: PASS"

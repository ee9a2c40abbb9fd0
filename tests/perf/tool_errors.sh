#!/usr/bin/env bash
# The perf tools' answers to bad input: every usage error exits 2 (whatever CLI11's own code), naming the flag and the
# value, before the benchmark prints its header; an output path that cannot be written is found before the run and
# leaves no file behind; a write that fails at the end exits non-zero and never says "wrote"; --help exits 0.
# Usage: tool_errors.sh STEALBENCH DEQUEBENCH [SOAK [GEMMBENCH [GPU_CHECK]]]     (an empty argument skips that tool)
set -uo pipefail
stealbench=$1 dequebench=$2 soak=${3:-} gemmbench=${4:-} gpu_check=${5:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

# expect RC PATTERN -- COMMAND...: the command exits RC within 60 s and its output matches PATTERN (grep -E). A usage
# error (2) must come before the tool's header; a failure never prints "wrote".
expect() {
  local want=$1 pattern=$2 rc out
  shift 3
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  local why=""
  if [ "$rc" -ne "$want" ]; then
    why="exited $rc (want $want)"
  elif ! grep -q -E -- "$pattern" <<<"$out"; then
    why="output lacks /$pattern/"
  elif [ "$want" -eq 2 ] && grep -q -E '^(# (stealbench|dequebench|soak|gemmbench)[ ,:]|GPU: )' <<<"$out"; then
    why="printed its header (ran) before refusing"
  elif [ "$want" -ne 0 ] && grep -q "wrote" <<<"$out"; then
    why="says it wrote a file"
  fi
  if [ -n "$why" ]; then
    echo "FAIL: ${*#"$work/"} $why:"
    sed 's/^/  | /' <<<"$out" | tail -6
    fails=$((fails + 1))
    return
  fi
  echo "ok: $want /$pattern/: $(basename "$1") ${*:2}"
}
# absent PATH...: none of the files exists (a refused run created nothing).
absent() {
  for p in "$@"; do
    [ -e "$p" ] && { echo "FAIL: $p exists after a refused run"; fails=$((fails + 1)); }
  done
  return 0
}

mkdir "$work/dir"
: >"$work/plain-file"
printf 'keep\n' >"$work/keep.json"
missing=/nonexistent/x.json
nan_values=(nan -nan inf -inf 1e300)

# ---- stealbench: a tiny run (a second or so) wherever the flag under test would let it start ----
sb=(--scenario seed-slow --policy static --steps 6 --warmup 0 --batch 64 --time-scale 0.01)
sb_nopol=(--scenario seed-slow --steps 6 --warmup 0 --batch 64 --time-scale 0.01)
expect 0 "Usage" -- "$stealbench" --help
expect 0 "Exit status" -- "$stealbench" --help
expect 0 "Usage" -- "$stealbench" --chunk-overhead --help
# Output paths: found before the run, each naming the flag, the path and the system's reason.
expect 2 "--json = '$missing'.*No such file or directory" -- "$stealbench" "${sb[@]}" --json "$missing"
expect 2 "--json = '$work/dir'.*Is a directory" -- "$stealbench" "${sb[@]}" --json "$work/dir"
expect 2 "--json = ''" -- "$stealbench" "${sb[@]}" --json ""
expect 2 "--trace-dir = '/nonexistent/d'.*No such file or directory" -- "$stealbench" "${sb[@]}" --trace-dir /nonexistent/d
expect 2 "--trace-dir = '$work/plain-file'.*Not a directory" -- "$stealbench" "${sb[@]}" --trace-dir "$work/plain-file"
# A write that fails at the end (a full disk): non-zero, the reason, no "wrote".
expect 1 "--json = '/dev/full'.*No space left on device" -- "$stealbench" "${sb[@]}" --json /dev/full
# A writable --json in a refused run: not created, and an existing file keeps what it held.
expect 2 "--scenario = 'bogus'" -- "$stealbench" --scenario bogus --json "$work/sb-new.json"
expect 2 "--attention-c" -- "$stealbench" "${sb[@]}" --attention-c nan --json "$work/keep.json"
absent "$work/sb-new.json"
[ "$(cat "$work/keep.json")" = keep ] || { echo "FAIL: a refused run changed an existing --json file"; fails=$((fails + 1)); }
# Every real-valued flag: a finite number in its range.
for flag in --attention-c --time-scale --bytes-per-sample --link-gbps --allreduce-mb --busbw-gbps --latency-us --noise --launch-lead-us; do
  for v in "${nan_values[@]}"; do
    expect 2 "$flag: value $v is out of range: expected a finite number in \[" -- "$stealbench" "${sb[@]}" "$flag" "$v"
  done
done
expect 2 "--time-scale: 'abc' is not a number" -- "$stealbench" "${sb[@]}" --time-scale abc
# --step-change STEP FACTOR: a timed step of the run and a factor in range.
expect 2 "--step-change FACTOR = 0: expected a number in \[0.01, 100\]" -- "$stealbench" "${sb[@]}" --step-change 0 0
expect 2 "--step-change FACTOR = nan" -- "$stealbench" "${sb[@]}" --step-change 5 nan
expect 2 "--step-change FACTOR = -1" -- "$stealbench" "${sb[@]}" --step-change 1 -1
expect 2 "--step-change FACTOR = inf" -- "$stealbench" "${sb[@]}" --step-change 1 inf
expect 2 "--step-change STEP = 6: expected a whole number in \[0, 5\]" -- "$stealbench" "${sb[@]}" --step-change 6 0.5
expect 2 "--step-change STEP = 1.5" -- "$stealbench" "${sb[@]}" --step-change 1.5 0.5
expect 2 "--step-change STEP = -1" -- "$stealbench" "${sb[@]}" --step-change -1 0.5
expect 2 "--step-change STEP = nan" -- "$stealbench" "${sb[@]}" --step-change nan 0.5
expect 2 "--step-change" -- "$stealbench" "${sb[@]}" --step-change 1
# --lengths: each a positive finite number within range.
printf '100\n1e300\n' >"$work/huge-lengths"
printf '100\nnan\n' >"$work/nan-lengths"
doc=(--scenario doclen --policy static --steps 2 --warmup 0 --batch 64 --time-scale 0.01)
expect 2 "--lengths = '$work/huge-lengths', line 2: '1e300' is not a number in \[1, 1e\+06\]" -- "$stealbench" "${doc[@]}" --lengths "$work/huge-lengths"
expect 2 "--lengths = '$work/nan-lengths', line 2: 'nan'" -- "$stealbench" "${doc[@]}" --lengths "$work/nan-lengths"
expect 2 "--lengths = '/nonexistent/l'.*No such file or directory" -- "$stealbench" "${doc[@]}" --lengths /nonexistent/l
# Whole-number flags: CLI11's range errors (its code 105) and wrong counts (114) exit 2 too.
expect 2 "--devices: Value 1 not in range" -- "$stealbench" "${sb[@]}" --devices 1
expect 2 "--steps: Value 0 not in range" -- "$stealbench" --scenario seed-slow --policy static --steps 0
expect 2 "--in-flight: Value 17 not in range" -- "$stealbench" "${sb[@]}" --in-flight 17
expect 2 "--devices-per-rank: Value 65 not in range" -- "$stealbench" "${sb[@]}" --devices-per-rank 65
expect 2 "--bogus" -- "$stealbench" "${sb[@]}" --bogus
expect 2 "--batch x \(--warmup \+ --steps\) = 4194304 x 100 samples a row: at most 268435456" -- "$stealbench" --scenario seed-slow --policy static \
  --batch 4194304 --warmup 0 --steps 100 --time-scale 0.01
# Names: scenarios and policies are checked before the run, not when their row comes.
expect 2 "--scenario = 'bogus'" -- "$stealbench" --scenario seed-slow,bogus --policy static --steps 1
expect 2 "--scenario = ''" -- "$stealbench" --scenario seed-slow, --policy static --steps 1
expect 2 "--policy = 'bogus'" -- "$stealbench" "${sb_nopol[@]}" --policy static,bogus
expect 2 "--policy packer needs doclen scenarios" -- "$stealbench" "${sb_nopol[@]}" --policy static,packer
# The --chunk-overhead mode: the same codes.
expect 2 "--chunks: Value 0 not in range" -- "$stealbench" --chunk-overhead --chunks 0
expect 2 "--bogus" -- "$stealbench" --chunk-overhead --bogus
# A good run still writes its JSON and says so.
expect 0 "# wrote $work/sb.json" -- "$stealbench" "${sb[@]}" --step-change 0 0.5 --json "$work/sb.json"
[ -s "$work/sb.json" ] || { echo "FAIL: stealbench wrote no $work/sb.json"; fails=$((fails + 1)); }

# ---- dequebench: a tiny run wherever the flag under test would let it start ----
dq=(--ops 1000 --wakes 10 --reps 1 --impl stealbatch --pattern owner_push_pop)
expect 0 "Usage" -- "$dequebench" --help
expect 0 "Exit status" -- "$dequebench" --help
expect 2 "--json = '$missing'.*No such file or directory" -- "$dequebench" "${dq[@]}" --json "$missing"
expect 2 "--json = '$work/dir'.*Is a directory" -- "$dequebench" "${dq[@]}" --json "$work/dir"
expect 1 "--json = '/dev/full'.*No space left on device" -- "$dequebench" "${dq[@]}" --json /dev/full
expect 2 "--reps: Value 0 not in range" -- "$dequebench" --ops 1000 --wakes 10 --reps 0 --impl stealbatch --json "$work/dq-new.json"
expect 2 "--impl: foo not in" -- "$dequebench" --ops 1000 --wakes 10 --reps 1 --impl foo
expect 2 "--pattern: foo not in" -- "$dequebench" --ops 1000 --wakes 10 --reps 1 --pattern foo
expect 2 "--ops: Value 10 not in range" -- "$dequebench" --ops 10
expect 2 "--steals requires --remote" -- "$dequebench" "${dq[@]}" --steals 200
expect 2 "--costs requires --remote" -- "$dequebench" "${dq[@]}" --costs
expect 2 "--json excludes --remote" -- "$dequebench" --remote --json "$work/dq-new.json"
absent "$work/dq-new.json"
expect 0 "# wrote $work/dq.json" -- "$dequebench" "${dq[@]}" --json "$work/dq.json"
[ -s "$work/dq.json" ] || { echo "FAIL: dequebench wrote no $work/dq.json"; fails=$((fails + 1)); }

# ---- soak ----
if [ -n "$soak" ]; then
  expect 0 "Exit status" -- "$soak" --help
  expect 2 "--json = '$missing'.*No such file or directory" -- "$soak" --seconds 1 --json "$missing"
  expect 2 "--seconds: value 0 is out of range" -- "$soak" --seconds 0 --json "$work/soak-new.json"
  expect 2 "--seconds: value nan is out of range" -- "$soak" --seconds nan
  expect 2 "--fault-rate: value nan is out of range" -- "$soak" --seconds 1 --fault-rate nan
  expect 2 "--faults = 'bogus'" -- "$soak" --seconds 1 --faults throw,bogus
  absent "$work/soak-new.json"
  expect 1 "--json = '/dev/full'.*No space left on device" -- "$soak" --seconds 1 --json /dev/full
fi

# ---- gemmbench ----
if [ -n "$gemmbench" ]; then
  gb=(--m 16 --layers 32,16 --reps 1 --min-ms 1)
  expect 0 "Exit status" -- "$gemmbench" --help
  expect 2 "--json = '$missing'.*No such file or directory" -- "$gemmbench" "${gb[@]}" --json "$missing"
  expect 2 "--reps: Value 0 not in range" -- "$gemmbench" --m 16 --layers 32,16 --reps 0 --min-ms 1 --json "$work/gb-new.json"
  expect 2 "--min-ms: value nan is out of range" -- "$gemmbench" --m 16 --layers 32,16 --reps 1 --min-ms nan
  expect 2 "--m = 'abc'" -- "$gemmbench" --m abc --layers 32,16 --reps 1 --min-ms 1
  expect 2 "--m = '0'" -- "$gemmbench" --m 0 --layers 32,16 --reps 1 --min-ms 1
  expect 2 "--layers = '32'" -- "$gemmbench" --m 16 --layers 32 --reps 1 --min-ms 1
  expect 2 "--libs = 'nosuch'" -- "$gemmbench" "${gb[@]}" --libs nosuch
  absent "$work/gb-new.json"
  if ldconfig -p | grep -q "libopenblas.so.0 "; then
    expect 1 "--json = '/dev/full'.*No space left on device" -- "$gemmbench" "${gb[@]}" --libs openblas --json /dev/full
  fi
fi

# ---- gpu_check: the checks before it looks for a GPU ----
if [ -n "$gpu_check" ]; then
  expect 0 "Exit status" -- "$gpu_check" --help
  expect 2 "--json = '$missing'.*No such file or directory" -- "$gpu_check" --json "$missing"
  expect 2 "--section: foo not in" -- "$gpu_check" --section foo --json "$work/gc-new.json"
  expect 2 "--steps: Value -1 not in range" -- "$gpu_check" --steps -1 --json "$work/gc-new.json"
  expect 2 "--vgpu-batch: Value 0 not in range" -- "$gpu_check" --vgpu-batch 0 --json "$work/gc-new.json"
  absent "$work/gc-new.json"
fi

if [ "$fails" -ne 0 ]; then
  echo "tool_errors: $fails case(s) failed"
  exit 1
fi
echo "tool_errors: PASS"

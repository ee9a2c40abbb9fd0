#!/usr/bin/env bash
# torch_lm's refusals and failures, each with the README's exit code and one line naming the cause: flags that a mode
# would drop unread, path flags (empty, a folder, unwritable, a file that is not a corpus cache), GPU devices with a
# CPU-only libtorch, data with nothing held out, a corrupt cache header, a failed cache write, and running out of
# memory. The refusals come before any data is read (no "# torch_lm:" header line). Small generated sources keep each
# run under a second or two.
#   torch_lm_errors.sh TORCH_LM
set -uo pipefail
lm=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() {
  echo "FAIL: $*"
  sed 's/^/    | /' "$work/log" | head -8
  failed=1
}

# 100 short definitions (a few of them held out by the content split), 3 (none held out), 100 of 6 KB each.
mkdir -p "$work/many" "$work/few" "$work/long"
for i in $(seq 1 100); do printf 'def f%d(x):\n    return x * %d + %d  # the %dth function\n\n' "$i" "$i" "$i" "$i"; done >"$work/many/m.py"
printf 'def one(x):\n    return x + 1 if x > 0 else x - 1\n\n\ndef two(y):\n    return [y * k for k in range(10)]\n\n\nclass Three:\n    def method(self):\n        return "three is a number"\n' >"$work/few/m.py"
for i in $(seq 1 100); do printf 'def g%d(x):\n    return x  # %s%d\n\n' "$i" "$(printf "%6000s" "" | tr ' ' "$(printf "\\x$(printf %x $((97 + i % 26)))")")" "$i"; done >"$work/long/m.py"
model=(--limit 0 --batch 8 --epochs 1 --max-len 64 --width 16 --layers 1 --heads 2 --costs tokens --devices cpu:1)
small=(--data "$work/many" "${model[@]}")

# run CODE TEXT ARGS...: torch_lm ARGS exits CODE, its output holds TEXT.
run() {
  local code=$1 text=$2
  shift 2
  timeout 120 "$lm" "$@" >"$work/log" 2>&1
  local rc=$?
  if [ "$rc" != "$code" ]; then fail "exit $rc (wanted $code) for $*"; return 1; fi
  if ! grep -q -- "$text" "$work/log"; then fail "no '$text' for $*"; return 1; fi
  return 0
}
# refused CODE TEXT ARGS...: as run, and before any data was read.
refused() {
  run "$@" || return 1
  if grep -q "^# torch_lm:" "$work/log"; then fail "refused only after loading the data: ${*:3}"; return 1; fi
  return 0
}

# --plain trains without the runtime and --export exits before training: what only those shape is refused, naming
# both flags. (Only the flag in question with the mode, so that it is the one refused.)
base=(--data "$work/many")
refused 2 "--save with --plain" "${base[@]}" --plain --save "$work/ck"
[ -e "$work/ck" ] && fail "--plain --save made its folder"
refused 2 "--resume with --plain" "${base[@]}" --plain --resume "$work/missing"
refused 2 "--json with --plain" "${base[@]}" --plain --json "$work/r.json"
refused 2 "--deterministic with --plain" "${base[@]}" --plain --deterministic
refused 2 "--compare with --plain" "${base[@]}" --plain --compare
refused 2 "--policy with --plain" "${base[@]}" --plain --policy steal
refused 2 "--devices with --plain" "${base[@]}" --plain --devices cpu:2
refused 2 "--costs with --plain" "${base[@]}" --plain --costs tokens
refused 2 "--optimizer sgd with --plain" "${base[@]}" --plain --optimizer sgd
for flag in --save --resume --json --trace; do
  refused 2 "$flag with --export" "${base[@]}" --export "$work/x.json" "$flag" "$work/other"
done
refused 2 "--deterministic with --export" "${base[@]}" --export "$work/x.json" --deterministic
refused 2 "--compare with --export" "${base[@]}" --export "$work/x.json" --compare
refused 2 "--plain with --export" "${base[@]}" --export "$work/x.json" --plain
refused 2 "--plain-threads without --plain" "${base[@]}" --plain-threads 2
[ -e "$work/x.json" ] && fail "a refused --export left its file"

# Path flags: empty, a folder, unwritable.
refused 2 "cache = '': an empty path" "${small[@]}" --cache ""
refused 2 "export = '': an empty path" "${small[@]}" --export ""
refused 2 "data = '': an empty path" "${model[@]}" --data ""
mkdir -p "$work/dir"
refused 2 "is a folder" "${small[@]}" --cache "$work/dir"
ls "$work" | grep -q "^dir\." && fail "a folder as --cache left $(ls "$work" | grep "^dir\.")"
refused 2 "is a folder" "${small[@]}" --export "$work/dir"
refused 2 "export = .*none/x.json.: cannot open it for writing: No such file" "${small[@]}" --export "$work/none/x.json"
refused 2 "cache = .*none/corpus.: cannot open it for writing: No such file" "${small[@]}" --cache "$work/none/corpus"
[ -e "$work/none" ] && fail "an unwritable path was created"

# A file that is not a corpus cache is never replaced: text, and a checkpoint's first bytes.
printf 'notes, not a cache\n' >"$work/notes.txt"
cp "$work/notes.txt" "$work/notes.orig"
refused 2 "not a text corpus cache" "${small[@]}" --cache "$work/notes.txt"
grep -q "$work/notes.txt" "$work/log" || fail "the refusal does not name the file"
cmp -s "$work/notes.txt" "$work/notes.orig" || fail "--cache replaced a text file"
printf '\x40\0\0\0\0\0\0\0{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' >"$work/step-1.safetensors"
cp "$work/step-1.safetensors" "$work/st.orig"
refused 2 "not a text corpus cache" "${small[@]}" --cache "$work/step-1.safetensors"
cmp -s "$work/step-1.safetensors" "$work/st.orig" || fail "--cache replaced a checkpoint"

# GPU devices with a CPU-only libtorch: the true reason, before loading and fitting.
if ldd "$lm" 2>/dev/null | grep -q "libc10_cuda"; then
  echo "skipped: the GPU-devices refusal (this torch_lm's libtorch has CUDA)"
else
  refused 2 "libtorch is CPU-only" --data "$work/many" --devices cuda:all
  grep -q "STEALBATCH_CUDA=OFF" "$work/log" && fail "--devices cuda:all blamed STEALBATCH_CUDA"
fi

# Data: a folder that does not exist; a corpus with nothing held out.
run 3 "does not exist" "${model[@]}" --data "$work/missing"
grep -q "apt-get" "$work/log" && fail "a missing --data folder was blamed on python3"
run 3 "held out" "${model[@]}" --data "$work/few"
grep -q "0\.0000" "$work/log" && fail "a figure of 0.0000 for nothing held out"
run 3 "held out" --data "$work/few" --export "$work/x.json"
run 3 "held out" --data "$work/few" --plain --plain-threads 1

# A corrupt cache header (2^32 documents): rebuilt at once, saying why.
cache=(--cache "$work/corpus")
run 0 "parameters sha256" "${small[@]}" "${cache[@]}"
python3 -c "
import struct, sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(40); f.write(struct.pack('<Q', 1 << 32))" "$work/corpus"
SECONDS=0
run 0 "header" "${small[@]}" "${cache[@]}"
grep -q "rebuilt" "$work/log" || fail "no word that the cache was rebuilt"
[ "$SECONDS" -le 20 ] || fail "the corrupt cache took ${SECONDS} s"
run 0 "cached" "${small[@]}" "${cache[@]}"

# A cache write that fails part way (a file size limit, as a full disk): the path and the OS's reason, exit 1, not
# "bad data", and no temporary file left.
# (Only torch_lm runs under the limit: the script's own output may be past it.)
mkdir -p "$work/w"
(
  trap '' XFSZ
  ulimit -f 2
  exec timeout 120 "$lm" "${small[@]}" --cache "$work/w/corpus"
) >"$work/log" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "exit $rc (wanted 1) for a failed cache write"
grep -q "File too large" "$work/log" || fail "a failed cache write without the OS's reason"
grep -q "$work/w/corpus" "$work/log" || fail "a failed cache write without the cache's path"
grep -q "bad data" "$work/log" && fail "a failed cache write called bad data"
[ -z "$(ls -A "$work/w")" ] || fail "a failed cache write left $(ls -A "$work/w")"

# Out of memory, building the model and inside a chunk: one line naming the flags to lower, exit 1, no stack trace.
oom() {
  (
    ulimit -v 2000000
    run 1 "out of memory" "$@"
  ) || { failed=1; return; }
  grep -q -- "--batch" "$work/log" && grep -q -- "--max-len" "$work/log" || fail "no flags to lower: $*"
  grep -q "frame #" "$work/log" && fail "a stack trace: $*"
  [ "$(grep -c "^torch_lm: " "$work/log")" = 1 ] || fail "not one line: $*"
}
if ldd "$lm" 2>/dev/null | grep -q -e libasan -e libtsan; then
  echo "skipped: out of memory under a sanitizer (its shadow memory needs more than the address-space limit)"
else
  oom --data "$work/many" --limit 0 --batch 8 --epochs 1 --max-len 8192 --width 4096 --layers 64 --heads 4 --costs tokens --devices cpu:1
  oom --data "$work/long" --limit 0 --batch 8 --epochs 1 --max-len 8192 --width 64 --layers 1 --heads 64 --costs tokens --devices cpu:2 --policy static
fi

[ "$failed" = 0 ] || exit 1
echo "torch_lm errors: ok"

#!/usr/bin/env bash
# --deterministic end to end: each example's 'parameters sha256' after the same training is one hash on cpu:1 static,
# on cpu:3 stealing with slowdowns, with merged steals off, and (MPIRUN set) on 2 ranks, with fixed cells and with
# the default ones; --compare's policies end equal to each other. Synthetic Fashion-MNIST-shaped data, a few steps.
# Usage: deterministic.sh MLP CNN [TORCH_MLP]      (MPIRUN=... adds the 2-rank runs)
set -uo pipefail
mlp=$1 cnn=$2 torch_mlp=${3:-}
read -r -a mpirun <<<"${MPIRUN:-}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
python3 - "$work" <<'PY'
import gzip, os, random, struct, sys
root = sys.argv[1]
random.seed(9)
def write(name, header, body):
    with gzip.open(os.path.join(root, name), "wb", compresslevel=1) as f:
        f.write(header + body)
n, t = 600, 64
write("train-images-idx3-ubyte.gz", struct.pack(">IIII", 0x803, n, 28, 28), bytes(random.randrange(256) for _ in range(n * 784)))
write("train-labels-idx1-ubyte.gz", struct.pack(">II", 0x801, n), bytes(random.randrange(10) for _ in range(n)))
write("t10k-images-idx3-ubyte.gz", struct.pack(">IIII", 0x803, t, 28, 28), bytes(random.randrange(256) for _ in range(t * 784)))
write("t10k-labels-idx1-ubyte.gz", struct.pack(">II", 0x801, t), bytes(random.randrange(10) for _ in range(t)))
PY

# sha PROGRAM ARGS...: the run's parameters sha256 (its first line), or the run's output on failure.
sha() {
  local out
  if ! out=$("$@" 2>&1); then
    echo "FAIL: $* exited non-zero:" >&2
    sed 's/^/  | /' <<<"$out" | tail -6 >&2
    return 1
  fi
  sed -n 's/^parameters sha256 \([0-9a-f]\{64\}\).*/\1/p' <<<"$out" | head -1
}

check() {  # NAME: every hash in the rest of the arguments is the first one
  local name=$1 first=$2
  shift 2
  for h in "$@"; do
    if [ -z "$first" ] || [ "$h" != "$first" ]; then
      echo "FAIL: $name: hashes differ: $first vs $h"
      fails=$((fails + 1))
      return
    fi
  done
  echo "ok: $name: one hash over $(($# + 1)) runs: $first"
}

for prog in "$mlp" "$cnn" $torch_mlp; do
  name=$(basename "$prog")
  run=(--data "$work" --epochs 2 --batch 100 --chunk 16 --deterministic)
  a=$(sha "$prog" "${run[@]}" --devices cpu:1 --policy static)
  b=$(sha "$prog" "${run[@]}" --devices cpu:3 --policy steal --slowdown 3,1,1.5)
  c=$(sha "$prog" "${run[@]}" --devices cpu:3 --policy steal --slowdown 1,4,1 --merge-stolen off)
  d=$(sha "$prog" "${run[@]}" --devices cpu:1 --policy static)
  hashes=("$a" "$b" "$c" "$d")
  if [ ${#mpirun[@]} -gt 0 ] && [ "$name" = mlp ]; then
    hashes+=("$(sha "${mpirun[@]}" -np 2 "$prog" "${run[@]}" --devices cpu:1 --policy steal --slowdown 2,1)")
  fi
  check "$name --deterministic on cpu:1, cpu:3 with slowdowns, merged steals off, again$([ ${#hashes[@]} -gt 4 ] && echo ', 2 ranks')" "${hashes[@]}"
  # --compare: both policies warmed up by the same step, then the same training: one hash for both.
  out=$("$prog" "${run[@]}" --devices cpu:2 --compare 2>&1)
  mapfile -t both < <(sed -n 's/^parameters sha256 \([0-9a-f]\{64\}\) (\(static\|steal\)).*/\1/p' <<<"$out")
  if [ ${#both[@]} -eq 2 ]; then check "$name --deterministic --compare: static and steal" "${both[@]}"; else
    echo "FAIL: $name --compare printed ${#both[@]} policy hashes, not 2"; sed 's/^/  | /' <<<"$out" | tail -6; fails=$((fails + 1))
  fi
done
# The default cells (--chunk auto: the batch / 16), in one process and across ranks: one grid whatever the devices.
run=(--data "$work" --epochs 1 --batch 96 --deterministic)
hashes=("$(sha "$mlp" "${run[@]}" --devices cpu:1 --policy static)" "$(sha "$mlp" "${run[@]}" --devices cpu:4 --slowdown 1,3,1,2)")
[ ${#mpirun[@]} -eq 0 ] || hashes+=("$(sha "${mpirun[@]}" -np 2 "$mlp" "${run[@]}" --devices cpu:2 --slowdown 1,1,2,1)")
check "mlp --deterministic --chunk auto on cpu:1, cpu:4 with slowdowns$([ ${#hashes[@]} -gt 2 ] && echo ', 2 ranks')" "${hashes[@]}"
[ "$fails" -eq 0 ] && echo "deterministic: PASS" || { echo "deterministic: $fails FAILED"; exit 1; }

# torch_lm: imbalance from the data. The byte-level transformer on the Python standard library's documents, on
# cpu:2, both orders, without and with device 0 at half speed: static, the packer, steal without costs and steal
# with costs, alternating epoch by epoch in one process (3 epochs of 512 documents; tokens/s of the median epoch,
# the ideal's share, each device's utilization); PyTorch DDP (gloo, 2 processes) on the same exported work beside
# each (TORCH_PYTHON); the four policies across 2 MPI ranks (cpu:1 each, grouped, each policy whole in turn); the
# adapter against plain libtorch on one device; the default run's bits per byte.
section_torch_lm() {
  local ex="$build/examples"
  [ -x "$ex/torch_lm" ] || skip "no examples/torch_lm in this build (STEALBATCH_TORCH: needs libtorch)"
  local cache="$out/pystdlib.corpus"
  {
    echo "# torch_lm: $(machine)"
    local order slow
    for order in shuffled grouped; do
      for slow in none 2,1; do
        lm_policies "$order" "$slow"
      done
    done
    lm_across_ranks
    lm_adapter_against_plain
    printf 'torch_lm defaults (cpu:2, grouped): '
    "$ex/torch_lm" --cache "$cache" 2>/dev/null | grep -E '^# unigram|^validation bits' | tr '\n' ' '
    echo
  } | tee "$out/torch_lm.txt"
}

# One configuration: the four policies in one --compare run, then DDP on the same documents and orders.
lm_policies() {
  local order=$1 slow=$2 json="$out/torch_lm_${1}_${2/,/-}.json" run="$out/torch_lm_${1}_${2/,/-}.run.json"
  local flags=(--cache "$cache" --devices cpu:2 --limit 512 --epochs 3 --order "$order")
  [ "$slow" = none ] || flags+=(--slowdown "$slow")
  "$ex/torch_lm" "${flags[@]}" --compare --json "$json" >/dev/null 2>&1
  local ddp=""
  if [ -n "${TORCH_PYTHON:-}" ]; then
    "$ex/torch_lm" "${flags[@]}" --export "$run" >/dev/null 2>&1
    local sd=()
    [ "$slow" = none ] || sd=(--slowdown "$slow")
    "$TORCH_PYTHON" perf/torch_lm_ref.py ddp --run "$run" --procs 2 "${sd[@]}" --json "$run.ddp" >/dev/null 2>&1
    ddp="$run.ddp"
  fi
  lm_row "$json" "$order, slowdown $slow" "$ddp"
}

# Across 2 MPI ranks on this machine, one device each: the four policies, each run whole in turn (two runtimes may not
# share the cluster's window at once).
lm_across_ranks() {
  if ! command -v mpirun >/dev/null; then
    echo "across 2 MPI ranks: not run (no mpirun)"
    return 0
  fi
  local json="$out/torch_lm_ranks_grouped.json"
  "${mpi[@]}" -np 2 "$ex/torch_lm" --cache "$cache" --devices cpu:1 --limit 512 --epochs 3 --order grouped --compare --json "$json" >/dev/null 2>&1 ||
    { echo "across 2 MPI ranks: torch_lm failed"; return 1; }
  lm_row "$json" "across 2 MPI ranks (cpu:1 each), grouped" ""
}

# One --compare run's row: tokens/s of each policy's median epoch, DDP's beside them when given, the ideal's share,
# each device's utilization and the ratios.
lm_row() {
  python3 - "$@" <<'EOF'
import json, statistics as s, sys
j = json.load(open(sys.argv[1]))
runs = {r["policy"]: r for r in j["runs"]}
def tps(r):  # tokens/s of the median epoch: the epochs hold the same tokens
    tokens = r["units_per_s"] * sum(r["epoch_seconds"])
    return tokens / len(r["epoch_seconds"]) / s.median(r["epoch_seconds"])
row = {p: tps(r) for p, r in runs.items()}
line = f"{sys.argv[2]}: tokens/s " + ", ".join(f"{p} {v:.0f}" for p, v in row.items())
if sys.argv[3]:
    d = json.load(open(sys.argv[3]))
    row["ddp"] = d["tokens_per_s"]
    line += f", DDP {d['tokens_per_s']:.0f}"
line += "; ideal's share " + ", ".join(f"{p} {r['ideal_fraction']:.2f}" for p, r in runs.items())
line += "; utilization " + ", ".join(f"{p} " + "/".join(f"{u:.2f}" for u in r["utilization"]) for p, r in runs.items())
st = row["steal"]
line += f"; steal/static {st / row['static']:.2f}x, steal/packer {st / row['packer']:.2f}x, steal/steal-nocosts {st / row['steal-nocosts']:.2f}x"
if "ddp" in row:
    line += f", steal/DDP {st / row['ddp']:.2f}x"
print(line)
EOF
}

# The adapter's cost: torch_lm on one device (2 threads) against plain libtorch on 2 threads, shuffled, 3 epochs,
# LM_ADAPTER_ROUNDS rounds (default 9; the host swings 10-20% between runs), the order alternating round by round
# (the adapter first in odd rounds); each side's tokens/s of its median epoch after the first, the median of the
# rounds' ratios.
lm_adapter_against_plain() {
  local ours=() theirs=() i a b
  local flags=(--cache "$cache" --limit 512 --epochs 3 --order shuffled)
  for ((i = 1; i <= ${LM_ADAPTER_ROUNDS:-9}; i++)); do
    if ((i % 2)); then a=$(lm_adapter_once); b=$(lm_plain_once); else b=$(lm_plain_once); a=$(lm_adapter_once); fi
    ours+=("$a") theirs+=("$b")
  done
  echo "torch_lm cpu:1 (2 threads), shuffled, 512 documents, 3 epochs, ${#ours[@]} alternating rounds: adapter ${ours[*]} tokens/s, plain libtorch ${theirs[*]} -> $(python3 -c "
import statistics as s, sys
n = len(sys.argv) // 2
a, b = [float(x) for x in sys.argv[1:n + 1]], [float(x) for x in sys.argv[n + 1:]]
print(f'median ratio {s.median(x / y for x, y in zip(a, b)):.2f}x, ratio of medians {s.median(a) / s.median(b):.2f}x')" "${ours[@]}" "${theirs[@]}")"
}
lm_adapter_once() {
  "$ex/torch_lm" "${flags[@]}" --devices cpu:1 --policy steal --json "$out/torch_lm_cpu1.json" >/dev/null 2>&1
  python3 -c "
import json, statistics as s, sys
r = json.load(open(sys.argv[1]))['runs'][0]
e = r['epoch_seconds']
print(f\"{r['units_per_s'] * sum(e) / len(e) / s.median(e[1:] or e):.0f}\")" "$out/torch_lm_cpu1.json"
}
lm_plain_once() {
  "$ex/torch_lm" "${flags[@]}" --plain --plain-threads 2 2>/dev/null | sed -n 's/^plain libtorch, [0-9]* threads: \([0-9]*\) tokens\/s.*/\1/p'
}

# torch_adapter: the libtorch adapter side by side with plain libtorch: torch_mlp and torch_cnn on cpu:2 against the
# same module on 2 threads (3 interleaved runs each, samples/s over the median epoch after the first); the main job's
# slowdown with --compare for torch_mlp and the hand-written mlp, with and without merged steals (7 interleaved
# rounds: single runs on 2 vCPUs vary by a third), with each device's utilization under steal; the default runs'
# accuracy.
section_torch_adapter() {
  local ex="$build/examples"
  [ -x "$ex/torch_mlp" ] || skip "no examples/torch_mlp in this build (STEALBATCH_TORCH: needs libtorch)"
  {
    echo "# libtorch adapter: $(machine)"
    adapter_against_plain
    adapter_slowdown_rounds
    for e in torch_mlp torch_cnn; do
      printf '%s --devices cpu:2, default epochs: ' "$e"
      "$ex/$e" --devices cpu:2 2>/dev/null | sed -n 's/^test accuracy //p'
    done
    # A raw ChunkFunction client: the BLAS pool as the runtime sets it, then shared by the devices (2 threads).
    if [ -x "$build/perf/raw_torch_client" ]; then
      "$build/perf/raw_torch_client" --epochs 3 --cache "$out/pystdlib.corpus" 2>/dev/null
      "$build/perf/raw_torch_client" --epochs 3 --blas-threads 2 --cache "$out/pystdlib.corpus" 2>/dev/null
    fi
  } | tee "$out/torch_adapter.txt"
}

adapter_against_plain() {
  local sps='s/.*), \([0-9]*\) samples\/s.*/\1/p' plain='s/^plain libtorch, [0-9]* threads: \([0-9]*\) samples\/s.*/\1/p'
  for spec in "torch_mlp 3" "torch_cnn 2"; do
    set -- $spec
    local ours=() theirs=()
    for _ in 1 2 3; do
      ours+=("$("$ex/$1" --devices cpu:2 --epochs "$2" 2>/dev/null | sed -n "$sps" | head -1)")
      theirs+=("$("$ex/$1" --plain --plain-threads 2 --epochs "$2" 2>/dev/null | sed -n "$plain")")
    done
    echo "$1 cpu:2, $2 epochs: adapter ${ours[*]}, plain libtorch ${theirs[*]} -> median ratio $(python3 -c "
import statistics as s, sys
a, b = [float(x) for x in sys.argv[1:4]], [float(x) for x in sys.argv[4:]]
print(f'{s.median(a) / s.median(b):.2f}x')" "${ours[@]}" "${theirs[@]}")"
  done
}

adapter_slowdown_rounds() {
  local ratio='s/^steal vs static: \([0-9.]*\)x.*/\1/p'
  local utils='/policy steal/ { s = 1 } s && /^\| cpu[0-9]/ { sub(/%/, "", $3); printf "%s%s", sep, $3; sep = "," }'
  local -A runs util
  local round e merge text r u key
  for round in 1 2 3 4 5 6 7; do
    for e in torch_mlp mlp; do
      for merge in on off; do
        text=$("$ex/$e" --compare --devices cpu:4 --slowdown 6.6,6.6,1,1 --epochs 1 --merge-stolen "$merge" 2>/dev/null)
        r=$(sed -n "$ratio" <<<"$text")
        u=$(awk "$utils" <<<"$text")
        runs[$e.$merge]+="$r "
        util[$e.$merge]+="$u "
        echo "round $round: $e --merge-stolen $merge: steal ${r}x faster than static, utilization % $u"
      done
    done
  done
  for key in torch_mlp.on torch_mlp.off mlp.on mlp.off; do
    python3 -c "
import statistics as s, sys
v = sorted(float(x) for x in sys.argv[2].split())
u = [[int(x) for x in run.split(',')] for run in sys.argv[3].split()]
m = s.median(v)
per = ', '.join(f'cpu{d} {s.median(run[d] for run in u) / 100:.2f}' for d in range(len(u[0])))
print(f'{sys.argv[1]}: median {m:.2f}x (steal/static {1 / m:.3f}), range {v[0]:.2f}-{v[-1]:.2f}x over {len(v)} runs; median utilization {per}')
" "$key" "${runs[$key]}" "${util[$key]}"
  done
}

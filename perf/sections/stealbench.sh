# stealbench: the runtime on simulated devices, every scenario at 4 devices (every policy, with --overhead), at 16 and
# 32 (static, lbbsp, steal-adaptive), the scale sweep (hetero at 4 to 64 devices), launch-bound at 4, 16 and 32
# devices; the document-length scenarios
# (static, steal without and with the given lengths, the packer) at 4, 16 and 32 devices and with device 0 at half
# speed, on torch_lm's own documents' lengths with the attention c that torch_lm fits here (without torch_lm:
# lognormal lengths and c = 200); then the tail model of varcost.
section_stealbench() {
  local scenarios=seed-slow,seed-skew,hetero,varcost,slowdown
  "$build/perf/stealbench" --scenario "$scenarios" --overhead --json "$out/sb4.json" 2>/dev/null | tee "$out/sb4.txt"
  for n in 16 32; do
    "$build/perf/stealbench" --scenario "$scenarios" --policy static,lbbsp,steal-adaptive --devices "$n" --batch $((n * 256)) --overhead \
      --json "$out/sb$n.json" 2>/dev/null | tee "$out/sb$n.txt"
  done
  "$build/perf/stealbench" --scenario scale --policy static,lbbsp,central,steal,steal-adaptive --overhead --json "$out/sb_scale.json" 2>/dev/null \
    | tee "$out/sb_scale.txt"
  # Parts of one GPU whose calls cost a fixed 900 us (180 us at the default time scale, the H200's): no inputs move
  # and nothing crosses a link, 1024 samples a device.
  for n in 4 16 32; do
    "$build/perf/stealbench" --scenario launch-bound --policy static,oracle,lbbsp,steal,steal-adaptive --devices "$n" --batch $((n * 1024)) \
      --time-scale 100 --allreduce-mb 0 --bytes-per-sample 0 --overhead --json "$out/sb_launch$n.json" 2>/dev/null | tee "$out/sb_launch$n.txt"
  done
  local doc=(--scenario doclen,doclen-grouped --policy static,steal-adaptive,steal-cost,packer)
  if [ -x "$build/examples/torch_lm" ] && "$build/examples/torch_lm" --cache "$out/pystdlib.corpus" --limit 512 --export "$out/sb_doclen_docs.json" \
       >/dev/null 2>&1; then
    python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
open(sys.argv[2], 'w').write(''.join(f'{len(d)}\n' for d in j['train']))
print(f\"{j['cost_c']:.0f}\")" "$out/sb_doclen_docs.json" "$out/sb_doclen_lengths.txt" > "$out/sb_doclen_c.txt"
    doc+=(--lengths "$out/sb_doclen_lengths.txt" --attention-c "$(cat "$out/sb_doclen_c.txt")")
    echo "# doclen: torch_lm's 512 documents' lengths, attention c = $(cat "$out/sb_doclen_c.txt") as torch_lm fitted it"
  else
    doc+=(--attention-c 200)
    echo "# doclen: no torch_lm in this build: lognormal lengths (median 245), attention c = 200"
  fi
  for n in 4 16 32; do
    "$build/perf/stealbench" "${doc[@]}" --devices "$n" --json "$out/sb_doclen$n.json" 2>/dev/null | tee "$out/sb_doclen$n.txt"
  done
  "$build/perf/stealbench" "${doc[@]}" --devices 4 --step-change 0 0.5 --json "$out/sb_doclen4_half.json" 2>/dev/null | tee "$out/sb_doclen4_half.txt"
  python3 perf/tail_model.py | tee "$out/tail_model.txt"
}

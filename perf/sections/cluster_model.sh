# cluster_model: the measurements that validate perf/cluster_model.py, and its run to 10,000 ranks. Each
# configuration: the unit costs (dequebench --remote --costs), then three interleaved rounds of the runtime's step
# with no compute (stealbench --time-scale 0.01) and stealbench's step on hetero, seed-slow and slowdown (one device
# a rank, 128 samples a rank), medians; on one node at 2, 4, 8 and 16 ranks (osc sm), and across emulated nodes (root: scripts/cluster.sh) at 2 and
# 4 nodes of one rank and 2 nodes of 2 ranks. Writes $out/cluster_model_validation.txt in the form the model reads
# (perf/cluster_model_measured.txt is the committed copy its test pins), then the validation and the scale table.
section_cluster_model() {
  command -v mpirun >/dev/null || skip "no mpirun (openmpi-bin)"
  grep -q '^STEALBATCH_MPI:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null || skip "$build is not built with STEALBATCH_MPI"
  local file="$out/cluster_model_validation.txt" cl="bash scripts/cluster.sh" r k rc
  # One configuration: LABEL RANKS NODES GATE LAUNCH... (the launcher's words before the program). GATE 0: ranks
  # share a core across emulated nodes, reported beside the model but not held to its tolerance (cluster_model.py says why).
  model_row() {
    local label=$1 ranks=$2 nodes=$3 gate=$4 round
    shift 4
    echo "## $label"
    "$@" "$build/perf/dequebench" --remote --costs --steals 2000 2>/dev/null | grep -E '^[a-z_0-9]+ [-0-9.]+$'
    # Three rounds, the empty step and the steps interleaved; the medians (an oversubscribed machine's steps vary by
    # 10-20% from run to run).
    for round in 1 2 3; do
      "$@" "$build/perf/stealbench" --devices-per-rank 1 --scenario hetero --policy steal-adaptive --steps 61 \
        --batch $((128 * ranks)) --time-scale 0.01 2>/dev/null | awk '$1 == "hetero" { print "empty", $4 * 1000 }'
      "$@" "$build/perf/stealbench" --devices-per-rank 1 --scenario hetero,seed-slow,slowdown --policy steal-adaptive --steps 21 \
        --batch $((128 * ranks)) 2>/dev/null | awk '$2 == "steal-adaptive" { print $1, $4, $5 }'
    done | awk -v r="$ranks" -v n="$nodes" -v g="$gate" -v b=$((128 * ranks)) '
      function median(list,   v, k, i, j, t) { k = split(list, v, " "); for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }; return v[int((k + 1) / 2)] }
      { steps[$1] = steps[$1] " " $2; ideal[$1] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++m] = $1 } }
      END {
        printf "step_overhead_us %s\n", median(steps["empty"])
        for (i = 1; i <= m; i++) if (order[i] != "empty")
          printf "measured ranks %d nodes %d devices 1 scenario %s batch %d chunk 16 step_ms %s ideal_ms %s gate %d\n", r, n, order[i], b, median(steps[order[i]]), ideal[order[i]], g
      }'
  }
  {
    echo "# perf/cluster_model.py's validation: unit costs and stealbench steps ($(machine))"
    for r in 2 4 8 16; do model_row "one node, $r ranks, osc sm" "$r" 1 1 "${mpi[@]}" -np "$r"; done
    $cl up 2 --delay-us 50 --rate 10gbit >/dev/null
    rc=$?
    if [ $rc -eq 0 ]; then
      trap 'bash scripts/cluster.sh down >/dev/null 2>&1' EXIT
      model_row "2 emulated nodes x 1 rank, one-way delay 50 us, 10gbit" 2 2 1 $cl run --ranks-per-node 1 --timeout 600 --
      model_row "2 emulated nodes x 2 ranks (two to a core), one-way delay 50 us, 10gbit" 4 2 0 $cl run --ranks-per-node 2 --timeout 600 --
      $cl up 4 --delay-us 50 --rate 10gbit >/dev/null
      model_row "4 emulated nodes x 1 rank (two nodes to a core), one-way delay 50 us, 10gbit" 4 4 0 $cl run --ranks-per-node 1 --timeout 600 --
      $cl down >/dev/null
    else
      echo "# across emulated nodes: skipped (scripts/cluster.sh up exited $rc)"
    fi
  } | tee "$file"
  python3 perf/cluster_model.py --validate "$file" | tee "$out/cluster_model.txt"
  python3 perf/cluster_model.py --scale --budget --inputs "$file" | tee -a "$out/cluster_model.txt"
}

#!/usr/bin/env bash
# joined.sh RANKS CASE PROGRAM: the cluster of processes that no MPI launcher started (as torchrun starts them):
# starts Open MPI's name server, then RANKS processes of PROGRAM CASE, each alone, joining through the port rank 0
# writes to a file. Passes when every process exits 0 within the bound; the server and any process left are ended.
set -u
ranks=$1 case_name=$2 program=$3
dir=$(mktemp -d)
pids=()
server=
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ -n "$server" ] && kill "$server" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
ompi-server --no-daemonize -r "$dir/uri" &
server=$!
for _ in $(seq 100); do [ -s "$dir/uri" ] && break; sleep 0.1; done
[ -s "$dir/uri" ] || { echo "joined: ompi-server wrote no URI"; exit 1; }
export OMPI_MCA_pmix_server_uri="file:$dir/uri" SB_JOIN_SIZE=$ranks SB_JOIN_PORT_FILE="$dir/port"
for ((r = 0; r < ranks; r++)); do
  SB_JOIN_RANK=$r timeout 100 "$program" "$case_name" > "$dir/rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for ((r = 0; r < ranks; r++)); do
  wait "${pids[$r]}"
  rc=$?
  echo "--- rank $r (exit status $rc)"
  cat "$dir/rank$r.log"
  [ "$rc" -eq 0 ] || status=1
done
exit $status

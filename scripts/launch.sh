#!/usr/bin/env bash
# An elastic launcher for the examples, in the spirit of torchrun's elastic agent: it runs the job across nodes with
# periodic checkpoints; when the job ends on a lost node, it drops that node and runs the job again on the survivors
# from the newest checkpoint. The global batch stays what the flags say: the runtime plans each rank's share for
# the ranks it has. It stops when the job ends well, when fewer than --min-nodes remain, or after --max-restarts.
#
#   scripts/launch.sh --nodes sbn0,sbn1,sbn2 --save DIR [--save-every N] [--ranks-per-node P] [--min-nodes M]
#                     [--max-restarts R] [--launcher cluster|mpirun] -- PROGRAM ARGS...
#
#   --launcher cluster  (default) the emulated cluster of scripts/cluster.sh: `cluster.sh run --hosts`
#   --launcher mpirun   mpirun --host NODE:P,... on real nodes (reachable by ssh, as mpirun's rsh launcher needs)
#
# A node is lost when it does not answer a ping from the first node; when every node answers, when the job's output
# names it (of the runtime's "rank R (node NODE)" or "node NODE (ranks ...)" "stopped answering" lines, the one that
# waited longest; Open MPI's "on node NODE exited on signal" or "lost communication with a remote daemon ... on node
# NODE"). The first node runs the launcher's mpirun and is never dropped.
# Every line the launcher prints starts with "launch:" and the unix time; the job's output passes through.
# Exit status: 0 when the job ended well, and for --help; 1 when it cannot go on (too few nodes, too many restarts, a
# failure that names no lost node); 2 for bad flags (a line naming the flag, then the usage), found before anything is
# made or started.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

say() { printf 'launch: %.3f %s\n' "$(date +%s.%N)" "$*"; }
usage() { sed -n '7,8p' "$0" | sed 's/^# \{0,1\}//'; }
bad() { echo "launch: $*" >&2; usage >&2; exit 2; }
# flag, the arguments after it: a value is there (not the next flag, nor the -- before the program).
need() { [ $# -ge 2 ] && [ -n "$2" ] && [[ "$2" != --* ]] || bad "$1 needs a value"; }
count() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || bad "$1 '$2': give a whole number, 1 or more"; }
whole() { [[ "$2" =~ ^(0|[1-9][0-9]*)$ ]] || bad "$1 '$2': give a whole number, 0 or more"; }

nodes="" save="" save_every=20 ppn=1 min_nodes=1 max_restarts=3 launcher=cluster
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    --nodes) need "$@"; nodes=$2 ;;
    --save) need "$@"; save=$2 ;;
    --save-every) need "$@"; whole "$1" "$2"; save_every=$2 ;;
    --ranks-per-node) need "$@"; count "$1" "$2"; ppn=$2 ;;
    --min-nodes) need "$@"; count "$1" "$2"; min_nodes=$2 ;;
    --max-restarts) need "$@"; whole "$1" "$2"; max_restarts=$2 ;;
    --launcher) need "$@"; launcher=$2 ;;
    *) bad "unknown option '$1'" ;;
  esac
  shift 2
done
[ $# -gt 0 ] || bad "no program (it follows --)"
[ -n "$nodes" ] && [ -n "$save" ] || bad "--nodes and --save are required"
case $launcher in cluster | mpirun) ;; *) bad "--launcher '$launcher': cluster or mpirun" ;; esac
IFS=, read -r -a alive <<<"$nodes"
[ "${#alive[@]}" -ge "$min_nodes" ] || bad "--min-nodes $min_nodes but only ${#alive[@]} nodes given"
mkdir -p "$save" || exit 2

run_job() {  # log, program, args: the program across the nodes in ${alive[@]}; its output into the log and to stdout
  local out=$1 hosts
  shift
  hosts=$(for n in "${alive[@]}"; do printf '%s:%s\n' "$n" "$ppn"; done | paste -sd,)
  local resume=()
  ls "$save"/step-*.safetensors >/dev/null 2>&1 && resume=(--resume "$save")
  if [ "$launcher" = cluster ]; then
    bash "$here/cluster.sh" run --hosts "$hosts" -- "$@" --save "$save" --save-every "$save_every" "${resume[@]}" 2>&1 | tee "$out"
  else
    mpirun --host "$hosts" "$@" --save "$save" --save-every "$save_every" "${resume[@]}" 2>&1 | tee "$out"
  fi
}

reachable() {  # node: answers a ping from the first node
  if [ "$launcher" = cluster ]; then
    bash "$here/cluster.sh" exec "${alive[0]}" ping -q -c 1 -W 1 "$1" >/dev/null 2>&1
  else
    ping -q -c 1 -W 1 "$1" >/dev/null 2>&1
  fi
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
restarts=0
while :; do
  say "starting on ${#alive[@]} nodes (${alive[*]}), $ppn ranks each$(ls "$save"/step-*.safetensors >/dev/null 2>&1 && echo ", resuming from $(ls "$save"/step-*.safetensors | tail -1)")"
  run_job "$log" "$@"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] && { say "the job ended well"; exit 0; }
  say "the job ended with status $rc"
  # Ranks that wait on a lost one stop answering too, and their own peers may name them: of the runtime's "stopped
  # answering" lines, the node whose access waited longest is the one that went first.
  named=$(sed -n 's/.*(node \([^)]*\)) stopped answering: .* has waited \([0-9]*\) ms.*/\2 \1/p; s/.*(node \([^)]*\)) stopped answering: no heartbeat for \([0-9]*\) ms.*/\2 \1/p; s/.*stealbatch: node \([^ ]*\) (ranks* [^)]*) stopped answering: .* has waited \([0-9]*\) ms.*/\2 \1/p' "$log" |
    sort -n | tail -1 | cut -d' ' -f2)
  # A node that does not answer a ping is lost whatever the output says; only when every node answers are the
  # nodes the output names taken for lost. A rank stuck on an unreachable node stops progressing and its peers may
  # name it first (its node answers a ping: it is kept).
  lost=()
  for n in "${alive[@]:1}"; do reachable "$n" || lost+=("$n"); done
  if [ ${#lost[@]} -eq 0 ]; then
    for n in "${alive[@]:1}"; do
      if [ "$n" = "$named" ] || grep -Eq "on node $n exited|on node $n( |$)" "$log"; then lost+=("$n"); fi
    done
  fi
  [ ${#lost[@]} -gt 0 ] || { say "no lost node found in the output or by ping: not relaunching (the failure is the job's own)"; exit 1; }
  keep=()
  for n in "${alive[@]}"; do [[ " ${lost[*]} " == *" $n "* ]] || keep+=("$n"); done
  alive=("${keep[@]}")
  say "lost ${lost[*]}; ${#alive[@]} nodes remain (${alive[*]})"
  [ "${#alive[@]}" -ge "$min_nodes" ] || { say "fewer than --min-nodes $min_nodes remain: not relaunching; the newest checkpoint is $(ls "$save"/step-*.safetensors 2>/dev/null | tail -1)"; exit 1; }
  restarts=$((restarts + 1))
  [ "$restarts" -le "$max_restarts" ] || { say "--max-restarts $max_restarts reached: not relaunching"; exit 1; }
done

#!/usr/bin/env bash
# The scripts' answers to bad arguments: exit status 2 with a line naming the flag or value and the usage, --help 0,
# and nothing started or created first. Needs neither root nor MPI: the tools that would make namespaces or start
# processes (ip, tc, mpirun, ...) are stand-ins here that log any call, and the test fails on any call logged.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0

mkdir "$work/bin"
for tool in ip nft iptables tc g++ mpirun ping taskset unshare sysctl; do
  printf '#!/bin/sh\necho "%s $*" >>"%s/called"\nexit 1\n' "$tool" "$work" >"$work/bin/$tool"
  chmod +x "$work/bin/$tool"
done
# The emulated cluster's own state, to compare at the end: nothing here may make or remove it.
cluster_state() {
  [ -e /run/stealbatch-cluster ] && echo "state dir present"
  command -v ip >/dev/null && ip netns list 2>/dev/null | awk '$1 ~ /^(sbn[0-9]+|sbhub)$/ { print $1 }' | sort
}
before=$(cluster_state)

# expect RC PATTERN -- COMMAND...: the command exits RC within 10 s, its output matches PATTERN (grep -E) and holds no
# error of bash's own (an unbound variable, a failed command's "line N:"); a usage error (RC 2) prints the usage too.
expect() {
  local want=$1 pattern=$2 rc out
  shift 3
  out=$(cd "$work" && timeout 10 env PATH="$work/bin:$PATH" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -q -E -- "$pattern" <<<"$out" || grep -q -E "unbound variable|: line [0-9]+: " <<<"$out" ||
     { [ "$want" -eq 2 ] && ! grep -q -E -- "$usage" <<<"$out"; }; then
    echo "FAIL: ${*#bash "$root"/} exited $rc (want $want); its output lacks /$pattern/ (or the usage), or has a bash error:"
    sed 's/^/  | /' <<<"$out" | tail -6
    fails=$((fails + 1))
    return
  fi
  echo "ok: $want /$pattern/: ${*#bash "$root"/}"
}

launch=(bash "$root/scripts/launch.sh")
usage="scripts/launch.sh --nodes"
good=(--nodes sbn0,sbn1 --save "$work/ckpt")
prog=(-- touch "$work/ran")
# A flag missing its value, at the end of the line or before the next flag.
for flag in --nodes --save --save-every --ranks-per-node --min-nodes --max-restarts --launcher; do
  expect 2 "launch: $flag needs a value" -- "${launch[@]}" "$flag"
done
expect 2 "launch: --nodes needs a value" -- "${launch[@]}" --nodes -- touch "$work/ran"
expect 2 "launch: --save needs a value" -- "${launch[@]}" --save --nodes sbn0 "${prog[@]}"
expect 2 "launch: --save needs a value" -- "${launch[@]}" --nodes sbn0 --save "" "${prog[@]}"
# Counts and step numbers: positive where a count is meant, whole numbers everywhere.
for bad in 0 -1 abc 1.5; do
  expect 2 "launch: --ranks-per-node '$bad'" -- "${launch[@]}" "${good[@]}" --ranks-per-node "$bad" "${prog[@]}"
done
expect 2 "launch: --min-nodes '0'" -- "${launch[@]}" "${good[@]}" --min-nodes 0 "${prog[@]}"
expect 2 "launch: --save-every 'x'" -- "${launch[@]}" "${good[@]}" --save-every x "${prog[@]}"
expect 2 "launch: --save-every '-5'" -- "${launch[@]}" "${good[@]}" --save-every -5 "${prog[@]}"
expect 2 "launch: --max-restarts '2x'" -- "${launch[@]}" "${good[@]}" --max-restarts 2x "${prog[@]}"
expect 2 "launch: --min-nodes 3 but only 2 nodes" -- "${launch[@]}" "${good[@]}" --min-nodes 3 "${prog[@]}"
expect 2 "launch: --launcher 'ssh'" -- "${launch[@]}" "${good[@]}" --launcher ssh "${prog[@]}"
expect 2 "launch: unknown option '--bogus'" -- "${launch[@]}" --bogus
expect 2 "launch: no program" -- "${launch[@]}" "${good[@]}"
expect 0 "scripts/launch.sh --nodes" -- "${launch[@]}" --help
[ -e "$work/ckpt" ] && { echo "FAIL: launch.sh made the --save folder before it refused its flags"; fails=$((fails + 1)); }

cluster=(bash "$root/scripts/cluster.sh")
usage="scripts/cluster.sh up K"
expect 2 "cluster: no command" -- "${cluster[@]}"
expect 2 "cluster: unknown command 'bogus'" -- "${cluster[@]}" bogus
for help in help --help -h; do expect 0 "scripts/cluster.sh up K" -- "${cluster[@]}" "$help"; done
# up: every check before anything is made (or an earlier cluster torn down).
expect 2 "cluster: up: K = ''" -- "${cluster[@]}" up
for k in 1 9 x; do expect 2 "cluster: up: K = '$k'" -- "${cluster[@]}" up "$k"; done
expect 2 "cluster: up: --delay-us needs a value" -- "${cluster[@]}" up 2 --delay-us
expect 2 "cluster: up: --rate needs a value" -- "${cluster[@]}" up 2 --rate
expect 2 "cluster: up: --delay-us needs a value" -- "${cluster[@]}" up 2 --delay-us --rate 1gbit
for d in -5 abc 2000000; do expect 2 "cluster: up: --delay-us '$d'" -- "${cluster[@]}" up 2 --delay-us "$d"; done
for r in fast 0bit 1gbitx; do expect 2 "cluster: up: --rate '$r'" -- "${cluster[@]}" up 2 --rate "$r"; done
expect 2 "cluster: up: unknown option '--bogus'" -- "${cluster[@]}" up 2 --bogus
# run
for flag in --ranks-per-node --hosts --timeout --osc; do
  expect 2 "cluster: run: $flag needs a value" -- "${cluster[@]}" run "$flag"
done
for p in 0 -1 x; do expect 2 "cluster: run: --ranks-per-node '$p'" -- "${cluster[@]}" run --ranks-per-node "$p" -- touch "$work/ran"; done
for s in 0 x; do expect 2 "cluster: run: --timeout '$s'" -- "${cluster[@]}" run --timeout "$s" -- touch "$work/ran"; done
for h in sbn0:0 sbn0:1,sbn1:x sbn0:1,,sbn1:1; do
  expect 2 "cluster: run: --hosts '$h'" -- "${cluster[@]}" run --hosts "$h" -- touch "$work/ran"
done
expect 2 "cluster: run: --ranks-per-node or --hosts" -- "${cluster[@]}" run --ranks-per-node 2 --hosts sbn0:1 -- touch "$work/ran"
expect 2 "cluster: run: unknown option '--bogus'" -- "${cluster[@]}" run --bogus -- touch "$work/ran"
expect 2 "cluster: run: no program" -- "${cluster[@]}" run --timeout 5 --
# The node commands: their arguments checked before the node is looked up, or anything sent.
expect 2 "cluster: exec: no NODE" -- "${cluster[@]}" exec
expect 2 "cluster: exec: no COMMAND" -- "${cluster[@]}" exec sbn1
expect 2 "cluster: agent: no HOST" -- "${cluster[@]}" agent
expect 2 "cluster: cut: no NODE" -- "${cluster[@]}" cut
expect 2 "cluster: heal: no NODE" -- "${cluster[@]}" heal
expect 2 "cluster: rate: no RATE" -- "${cluster[@]}" rate sbn1
expect 2 "cluster: rate: RATE 'fast'" -- "${cluster[@]}" rate sbn1 fast
expect 2 "cluster: cpu: no FRACTION" -- "${cluster[@]}" cpu sbn1
for f in 0 2 0.5x x; do expect 2 "cluster: cpu: FRACTION '$f'" -- "${cluster[@]}" cpu sbn1 "$f"; done
expect 2 "cluster: signal: no NODE" -- "${cluster[@]}" signal
expect 2 "cluster: signal: no SIG" -- "${cluster[@]}" signal sbn1
for s in BOGUS -9 0 99; do expect 2 "cluster: signal: unknown signal '$s'" -- "${cluster[@]}" signal sbn1 "$s"; done
# Well-formed arguments pass the checks: with no cluster up, they fail on that (1), not as usage errors.
if [ ! -e /run/stealbatch-cluster ]; then
  expect 1 "cluster: run: no cluster is up" -- "${cluster[@]}" run --hosts sbn0:1,sbn1:2 --timeout 120 --osc sm,ucx -- touch "$work/ran"
  expect 1 "cluster: no node 'sbn1'" -- "${cluster[@]}" signal sbn1 KILL mlp
  expect 1 "cluster: no node 'sbn1'" -- "${cluster[@]}" signal sbn1 SIGSTOP
  expect 1 "cluster: no node 'sbn1'" -- "${cluster[@]}" cpu sbn1 0.2
  expect 1 "cluster: no node 'sbn1'" -- "${cluster[@]}" rate sbn1 20mbit
fi

usage="bash scripts/repeat_tests.sh \[RUNS\]"
mkdir "$work/build" && : >"$work/build/CTestTestfile.cmake"
for runs in 0 -3 abc; do expect 2 "repeat_tests: RUNS '$runs'" -- bash "$root/scripts/repeat_tests.sh" "$runs" "$work/build"; done
expect 0 "bash scripts/repeat_tests.sh \[RUNS\]" -- bash "$root/scripts/repeat_tests.sh" --help

[ -e "$work/ran" ] && { echo "FAIL: a program was started"; fails=$((fails + 1)); }
if [ -s "$work/called" ]; then
  echo "FAIL: a refused command went on to run tools that make or start things:"
  sed 's/^/  | /' "$work/called" | head -10
  fails=$((fails + 1))
fi
[ "$(cluster_state)" = "$before" ] || { echo "FAIL: the emulated cluster's namespaces or state changed"; fails=$((fails + 1)); }

if [ $fails -ne 0 ]; then echo "usage_errors: $fails case(s) failed"; exit 1; fi
echo "usage_errors: PASS"

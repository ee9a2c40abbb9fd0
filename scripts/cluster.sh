#!/usr/bin/env bash
# An emulated cluster on one machine: K "nodes", each a network namespace with its own host name and its share of the
# machine's cores, joined by veth pairs to a bridge in a hub namespace, with a one-way delay (scripts/netdelay.cpp,
# through an iptables NFQUEUE: this kernel family may lack netem) and a rate limit (tbf) on each node's link. Only the
# namespaces' own addresses (10.77.0.0/24) are used; the machine's own namespace is not touched. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and the Debian
# packages iproute2, iptables, nftables and libnetfilter-queue-dev (scripts/setup.sh installs them).
#
#   scripts/cluster.sh up K [--delay-us D] [--rate RATE]   K = 2..8 nodes sbn0..sbnK-1; RATE as tc says it (1gbit)
#   scripts/cluster.sh run [--ranks-per-node P | --hosts sbn0:P,sbn2:P] [--timeout S] [--osc C] -- PROGRAM ARGS...
#                                                           mpirun from sbn0 across every node, over TCP on the links,
#                                                           one-sided steals through osc ucx over TCP with the progress
#                                                           agent (--osc: Open MPI's osc list, default sm,ucx); ends
#                                                           after S seconds (default 600) whatever happens
#   scripts/cluster.sh exec NODE COMMAND...                 a command inside a node (its host name set)
#   scripts/cluster.sh cut NODE | heal NODE                 drop every packet to and from NODE (100% loss), or stop
#   scripts/cluster.sh rate NODE RATE                       change NODE's link rate (a node whose link slows)
#   scripts/cluster.sh cpu NODE FRACTION                    cap NODE's processes at FRACTION of its cores (a CPU
#                                                           cgroup quota: a node that computes slower); 1 lifts it
#   scripts/cluster.sh signal NODE SIG [NAME]               send SIG to every process of NODE (KILL, STOP, CONT), or
#                                                           to those named NAME only (its ranks, not Open MPI's daemon)
#   scripts/cluster.sh status | down                        what is up; tear everything down (always safe to run)
#   scripts/cluster.sh help                                 this text
#
# Exit status: 0 when done (help too); 1 when a step fails (no cluster up, no such node, a command that failed); 2 for
# a usage error (a line saying what is wrong, then the usage), found before anything is made, sent or torn down; 77
# with the reason when this machine cannot make namespaces (not root, no CAP_NET_ADMIN, no nft): the tests report
# "skipped" then. `up` tears down an earlier cluster first, and a failed `up` tears down what it made.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=/run/stealbatch-cluster
subnet=10.77.0
hub=sbhub

die() { echo "cluster: $*" >&2; exit 1; }
skip() { echo "cluster: skipped: $*" >&2; exit 77; }
usage() { sed -n '/^#   scripts\/cluster.sh up /,/^#   scripts\/cluster.sh help /p' "$0" | sed 's/^# \{0,1\}//'; }
bad() { echo "cluster: $*" >&2; usage >&2; exit 2; }
# command, flag, the arguments after it: a value is there (not the next flag, nor the -- before the program).
need() { local where=$1; shift; [ $# -ge 2 ] && [ -n "$2" ] && [[ "$2" != --* ]] || bad "$where: $1 needs a value"; }
count() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || bad "$1 '$2': give a whole number, 1 or more"; }
# A rate as tc says it (10gbit, 500mbit, or bare bits a second), in bits a second; nothing when it is not one.
rate_bits() {
  [[ "$1" =~ ^[0-9]+(\.[0-9]+)?([kKmMgG]?bit)?$ ]] || return 0
  echo "$1" | awk '{v=$1; m=1; if (v ~ /[gG]bit$/) m=1e9; else if (v ~ /[mM]bit$/) m=1e6; else if (v ~ /[kK]bit$/) m=1e3; sub(/[a-zA-Z]+$/, "", v); printf "%d", v*m}'
}
check_rate() { [ "$(rate_bits "$2")" -gt 0 ] 2>/dev/null || bad "$1 '$2': give it as tc does (10gbit, 1gbit, 500mbit)"; }
# KILL, kill, SIGKILL or 9: the signal's name (KILL); status 1 for what names no signal (bash's own ERR, EXIT and
# the like included: kill -l numbers them outside 1..64).
signal_name() {
  local s=${1^^} n
  s=${s#SIG}
  [[ "$s" =~ ^[A-Z0-9][A-Z0-9+-]*$ ]] || return 1
  if [[ "$s" =~ ^[0-9]+$ ]]; then
    n=$s
    s=$(kill -l "$n" 2>/dev/null) || return 1
  else
    n=$(kill -l "$s" 2>/dev/null) || return 1
  fi
  [ "$n" -ge 1 ] && [ "$n" -le 64 ] && echo "$s"
}
nodes() { [ -f "$state/nodes" ] && cat "$state/nodes"; }
addr() { echo "$subnet.$((10 + ${1#sbn}))"; }
is_node() { nodes | grep -qx "$1" || die "no node '$1' (nodes: $(nodes | tr '\n' ' '))"; }
# The cores of node N: the machine's cores split evenly over the nodes (node i of K on C >= K cores gets
# [i*C/K, (i+1)*C/K)), or one shared core each when there are more nodes than cores. Each node's processes are bound
# to its cores, as a real node's are to its own: the runtime sizes its threads by the cores it may use.
node_cores() {
  local i=${1#sbn} k c
  k=$(nodes | wc -l)
  c=$(nproc --all)
  if [ "$c" -ge "$k" ]; then
    echo "$((i * c / k))-$(((i + 1) * c / k - 1))"
  else
    echo "$((i % c))"
  fi
}
in_node() {
  local n=$1; shift
  ip netns exec "$n" taskset -c "$(node_cores "$n")" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$n" "$@"
}

can_make() {
  [ "$(id -u)" = 0 ] || skip "not root: network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN"
  command -v ip >/dev/null || skip "no 'ip' (Debian package iproute2)"
  command -v nft >/dev/null || skip "no 'nft' (Debian package nftables)"
  command -v iptables >/dev/null || skip "no 'iptables' (Debian package iptables)"
  command -v tc >/dev/null || skip "no 'tc' (Debian package iproute2)"
  local probe=sbprobe$$
  ip netns add "$probe" 2>/dev/null || skip "cannot make a network namespace here ('ip netns add' failed: no CAP_NET_ADMIN, or a container without it)"
  ip netns del "$probe"
}

# The CPU cgroup of node N (v2's cpu.max, or v1's cfs quota), made on first use.
cgroup_of() {
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo "/sys/fs/cgroup/stealbatch-$1"; else echo "/sys/fs/cgroup/cpu/stealbatch-$1"; fi
}

# A short period (2 ms, or what makes the quota the kernel's least, 1 ms): the quota stops the node's processes for the
# rest of each period once spent, and a long one would freeze the node for tens of milliseconds at a time (its
# progress agent with it), not slow it down.
set_cpu() {  # node, fraction of its cores (0.01 to 1)
  local n=$1 f=$2 cg cores period=2000 quota
  cg=$(cgroup_of "$n")
  [ -d "$(dirname "$cg")" ] || die "cpu: no CPU cgroup controller at $(dirname "$cg")"
  mkdir -p "$cg" || die "cpu: cannot make $cg"
  cores=$(node_cores "$n" | awk -F- '{ print ($2 == "" ? 1 : $2 - $1 + 1) }')
  period=$(awk -v f="$f" -v c="$cores" -v p=$period 'BEGIN { q = 1000 / (f * c); printf "%d", (q > p ? q + 1 : p) }')
  quota=$(awk -v f="$f" -v c="$cores" -v p="$period" 'BEGIN { printf "%d", f * c * p }')
  if [ -f "$cg/cpu.max" ]; then
    if [ "$f" = 1 ]; then echo "max $period" >"$cg/cpu.max"; else echo "$quota $period" >"$cg/cpu.max"; fi || die "cpu: writing $cg/cpu.max failed"
  else
    echo -1 >"$cg/cpu.cfs_quota_us" && echo "$period" >"$cg/cpu.cfs_period_us" || die "cpu: writing $cg/cpu.cfs_period_us failed"
    [ "$f" = 1 ] || echo "$quota" >"$cg/cpu.cfs_quota_us" || die "cpu: writing $cg/cpu.cfs_quota_us ($quota) failed"
  fi
  local keep p moved=0
  keep=$(cat "$state/netdelay.$n.pid" 2>/dev/null)
  for p in $(ip netns pids "$n" | grep -vx "${keep:-none}"); do echo "$p" >"$cg/cgroup.procs" 2>/dev/null && moved=$((moved + 1)); done
  echo "cluster: $n capped at $f of its cores ($moved processes; quota $quota us every $period us)"
}

down() {
  local n pids
  for n in $(nodes) $hub; do
    ip netns list 2>/dev/null | grep -qw "^$n" || continue
    # Processes outlive a deleted namespace: end them first (the delayer too), or they hold it, and a job, forever.
    pids=$(ip netns pids "$n" 2>/dev/null)
    [ -n "$pids" ] && kill -CONT $pids 2>/dev/null && kill -KILL $pids 2>/dev/null
    ip netns del "$n" 2>/dev/null
    rm -rf "/etc/netns/$n"
  done
  # Namespaces of an earlier state file that was lost.
  for n in $(ip netns list 2>/dev/null | awk '/^sbn[0-9]+/ {print $1}'); do
    pids=$(ip netns pids "$n" 2>/dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    ip netns del "$n" 2>/dev/null
    rm -rf "/etc/netns/$n"
  done
  # The CPU cgroups, once their processes are gone.
  for n in /sys/fs/cgroup/stealbatch-sbn* /sys/fs/cgroup/cpu/stealbatch-sbn*; do [ -d "$n" ] && rmdir "$n" 2>/dev/null; done
  rm -rf "$state"
}

burst_for() {  # a tbf burst for RATE (checked by check_rate): at least 64 KiB (a GSO packet), else a millisecond of it
  local bits
  bits=$(rate_bits "$1")
  echo $(( bits / 8 / 1000 > 65536 ? bits / 8 / 1000 : 65536 ))
}

set_rate() {  # node, rate ("" = unlimited)
  local n=$1 r=$2
  if [ -z "$r" ]; then
    ip netns exec "$n" tc qdisc del dev eth0 root 2>/dev/null
    return 0
  fi
  ip netns exec "$n" tc qdisc replace dev eth0 root tbf rate "$r" burst "$(burst_for "$r")" latency 100ms || die "tc tbf rate $r on $n failed"
}

up() {
  local k=${1:-}; shift || true
  local delay=0 rate=""
  [[ "$k" =~ ^[2-8]$ ]] || bad "up: K = '$k': give 2 to 8 nodes"
  while [ $# -gt 0 ]; do
    case $1 in
      --delay-us) need up "$@"; delay=$2 ;;
      --rate) need up "$@"; rate=$2 ;;
      *) bad "up: unknown option '$1'" ;;
    esac
    shift 2
  done
  [[ "$delay" =~ ^(0|[1-9][0-9]{0,6})$ ]] && [ "$delay" -le 1000000 ] || bad "up: --delay-us '$delay': give 0 to 1000000 microseconds"
  [ -z "$rate" ] || check_rate "up: --rate" "$rate"
  can_make
  down
  mkdir -p "$state"
  # Whatever fails from here (a command, or die) tears down what was made.
  trap 'rc=$?; [ $rc -eq 0 ] || { echo "cluster: up failed; tearing down" >&2; down; }' EXIT
  set -e
  if [ "$delay" -gt 0 ]; then
    # The delayer, built here from its one file (seconds), so that the tool needs no build folder.
    g++ -O2 -std=c++20 -o "$state/netdelay" "$here/netdelay.cpp" -lnetfilter_queue -lnfnetlink 2>"$state/netdelay.build.log" ||
      { tail -20 "$state/netdelay.build.log" >&2; die "could not build scripts/netdelay.cpp (Debian package libnetfilter-queue-dev)"; }
  fi
  ip netns add $hub
  ip -n $hub link add br0 type bridge
  ip -n $hub link set br0 up
  ip -n $hub link set lo up
  local i n hosts=""
  for i in $(seq 0 $((k - 1))); do hosts+="$(addr sbn$i) sbn$i"$'\n'; done
  for i in $(seq 0 $((k - 1))); do
    n=sbn$i
    echo "$n" >>"$state/nodes"
    ip netns add $n
    ip -n $n link add eth0 type veth peer name "v$i" netns $hub
    ip -n $hub link set "v$i" master br0 up
    ip -n $n addr add "$(addr $n)/24" dev eth0
    ip -n $n link set eth0 up
    ip -n $n link set lo up
    # TCP gives up on an unanswered connection after 3 retransmissions (about 3 s) instead of 15 (about 15 min):
    # mpirun, told to end the job, waits on its connection to each node's daemon, and one to a lost node would
    # hold it that long. Per namespace; the machine's own setting is not touched.
    ip netns exec $n sysctl -q -w net.ipv4.tcp_retries2=3
    # `ip netns exec` mounts /etc/netns/NODE/* over /etc: each node resolves the others' names, and its own.
    mkdir -p "/etc/netns/$n"
    printf '127.0.0.1 localhost\n%s' "$hosts" >"/etc/netns/$n/hosts"
    [ -n "$rate" ] && set_rate $n "$rate"
    if [ "$delay" -gt 0 ]; then
      # iptables' NFQUEUE target: this kernel family builds the xtables target but not nftables' own queue.
      ip netns exec $n iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0
      ip netns exec $n setsid "$state/netdelay" --queue 0 --delay-us "$delay" </dev/null >"$state/netdelay.$n.log" 2>&1 &
      echo $! >"$state/netdelay.$n.pid"
      # Bound to its queue before any packet needs it (an unbound queue drops what reaches it).
      for _ in $(seq 100); do grep -q "^netdelay: queue" "$state/netdelay.$n.log" && break; sleep 0.05; done
      grep -q "^netdelay: queue" "$state/netdelay.$n.log" || { cat "$state/netdelay.$n.log" >&2; die "the delayer of $n did not start"; }
    fi
  done
  echo "delay_us=$delay rate=${rate:-unlimited}" >"$state/link"
  # Every node reaches every other before `up` returns (the delayers bound and forwarding).
  for i in $(seq 1 $((k - 1))); do
    ip netns exec sbn0 ping -c 1 -W 5 "$(addr sbn$i)" >/dev/null || die "sbn0 cannot reach sbn$i"
  done
  trap - EXIT
  set +e
  echo "cluster: up: $k nodes ($(for n in $(nodes); do printf '%s on cores %s, ' $n "$(node_cores $n)"; done)one-way delay ${delay} us, rate ${rate:-unlimited})"
}

run() {
  local ppn="" limit=600 osc=sm,ucx hostlist="" host='[A-Za-z0-9._-]+(:[1-9][0-9]*)?'
  while [ $# -gt 0 ]; do
    case $1 in
      --) shift; break ;;
      --ranks-per-node) need run "$@"; count "run: --ranks-per-node" "$2"; ppn=$2 ;;
      --hosts) need run "$@"; [[ "$2" =~ ^$host(,$host)*$ ]] || bad "run: --hosts '$2': give NODE:P,NODE:P (P ranks, 1 or more)"; hostlist=$2 ;;
      --timeout) need run "$@"; count "run: --timeout" "$2"; limit=$2 ;;
      --osc) need run "$@"; osc=$2 ;;
      *) bad "run: unknown option '$1' (the program follows --)" ;;
    esac
    shift 2
  done
  [ -z "$ppn" ] || [ -z "$hostlist" ] || bad "run: --ranks-per-node or --hosts, not both"
  [ $# -gt 0 ] || bad "run: no program (it follows --)"
  [ -f "$state/nodes" ] || die "run: no cluster is up (scripts/cluster.sh up K first)"
  [ -n "$hostlist" ] || hostlist=$(nodes | sed "s/\$/:${ppn:-1}/" | paste -sd,)
  # Within a node the ranks share memory (vader); between nodes, TCP on eth0 for messages and for Open MPI's own
  # wiring, UCX over TCP for the one-sided window (osc sm serves only windows within one node: here the node's
  # pulse words, which never cross the link). UCX is kept off shared memory: the nodes share /dev/shm, and a window
  # through it would not cross the link.
  in_node sbn0 timeout --signal=TERM --kill-after=10 "$limit" \
    mpirun --allow-run-as-root --oversubscribe --bind-to none --host "$hostlist" \
    --mca plm_rsh_agent "$here/cluster.sh agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 --mca btl self,vader,tcp --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3 \
    --mca osc "$osc" -x UCX_TLS=self,tcp -x UCX_NET_DEVICES=eth0 -x UCX_WARN_UNUSED_ENV_VARS=n \
    "$@"
}

status() {
  [ -f "$state/nodes" ] || { echo "cluster: down"; return 0; }
  echo "cluster: up: $(nodes | tr '\n' ' ')($(cat "$state/link"))"
  local n pid
  for n in $(nodes); do
    pid=$(cat "$state/netdelay.$n.pid" 2>/dev/null)
    echo "  $n $(addr $n) cores $(node_cores $n), processes: $(ip netns pids $n 2>/dev/null | wc -l)${pid:+, delayer $( kill -0 "$pid" 2>/dev/null && echo running || echo GONE)}"
  done
}

[ $# -gt 0 ] || bad "no command"
cmd=$1
shift
# The node commands' arguments: checked before the node is looked up, and before anything is sent.
case $cmd in
  exec) [ $# -ge 1 ] || bad "exec: no NODE"; [ $# -ge 2 ] || bad "exec: no COMMAND" ;;
  agent) [ $# -ge 1 ] || bad "agent: no HOST"; [ $# -ge 2 ] || bad "agent: no COMMAND" ;;
  cut | heal) [ $# -ge 1 ] || bad "$cmd: no NODE" ;;
  rate) [ $# -ge 1 ] || bad "rate: no NODE"; [ $# -ge 2 ] || bad "rate: no RATE"; check_rate "rate: RATE" "$2" ;;
  cpu)
    [ $# -ge 1 ] || bad "cpu: no NODE"
    [ $# -ge 2 ] || bad "cpu: no FRACTION"
    [[ "$2" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] && awk -v f="$2" 'BEGIN { exit !(f >= 0.01 && f <= 1) }' ||
      bad "cpu: FRACTION '$2': give 0.01 to 1" ;;
  signal)
    [ $# -ge 1 ] || bad "signal: no NODE"
    [ $# -ge 2 ] || bad "signal: no SIG"
    sig=$(signal_name "$2") || bad "signal: unknown signal '$2' (KILL, STOP, CONT, ...)" ;;
esac
case $cmd in
  help | -h | --help) sed -n "2,/^set -uo/p" "$0" | sed "\$d; s/^# \\{0,1\\}//" ;;
  up) up "$@" ;;
  down) down; echo "cluster: down" ;;
  run) run "$@" ;;
  status) status ;;
  exec) is_node "$1"; n=$1; shift; in_node "$n" "$@" ;;
  # Open MPI's rsh launcher: `agent HOST COMMAND...`, the command a shell line (as ssh would pass it on).
  agent) n=$1; shift; in_node "$n" sh -c "$*" ;;
  cut)
    is_node "$1"
    ip netns exec "$1" nft -f - <<EOF
table inet sbcut {
  chain in { type filter hook input priority -10; iifname "eth0" drop; }
  chain out { type filter hook output priority -10; oifname "eth0" drop; }
}
EOF
    echo "cluster: $1 cut off (every packet on its link dropped)" ;;
  heal) is_node "$1"; ip netns exec "$1" nft delete table inet sbcut 2>/dev/null; echo "cluster: $1 healed" ;;
  rate) is_node "$1"; set_rate "$1" "$2"; echo "cluster: $1 link at $2" ;;
  cpu) is_node "$1"; set_cpu "$1" "$2" ;;
  signal)
    is_node "$1"
    # Every process in the node but the delayer (it is the link, not the node), or only those named NAME (a
    # program's ranks, and not Open MPI's daemon).
    keep=$(cat "$state/netdelay.$1.pid" 2>/dev/null)
    pids=""
    for p in $(ip netns pids "$1" | grep -vx "${keep:-none}"); do
      [ -z "${3:-}" ] || [ "$(cat /proc/$p/comm 2>/dev/null)" = "${3:0:15}" ] && pids+=" $p"
    done
    [ -n "$pids" ] && kill -s "$sig" $pids
    echo "cluster: SIG$sig to $(echo $pids | wc -w) processes of $1${3:+ named $3}" ;;
  *) bad "unknown command '$cmd'" ;;
esac

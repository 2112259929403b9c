#!/usr/bin/env bash
# netns.sh — emulate a small cluster on one machine: 3 "hosts" as network
# namespaces, each with one veth link to a bridge that lives in a fourth
# (switch) namespace, private addresses 10.213.0.1..3/24 assigned inside the
# host namespaces only, and optional tbf rate limits on every link in both
# directions. Nothing is configured in the caller's own network namespace, so
# no traffic can leave the machine and no host route changes.
#
# It does not launch jobs itself; `run` executes a command of yours with the
# namespace names in the environment and always tears everything down
# afterwards (EXIT/INT/TERM trap), even when the command or the setup fails.
#
# Usage:
#   tools/netns.sh check                      exit 0 if namespaces can be made, 77 (with a reason) if not
#   tools/netns.sh up   [-p PREFIX] [-r RATE] [-n HOSTS]   create (RATE like 400mbit; default unshaped)
#   tools/netns.sh down [-p PREFIX] [-n HOSTS]             destroy (idempotent)
#   tools/netns.sh run  [-p PREFIX] [-r RATE] [-n HOSTS] -- CMD ARGS...
#       runs CMD with NETNS_HOSTS="P-h0 P-h1 P-h2", NETNS_ADDRS="10.213.0.1 ..."
#       and NETNS_RATE set; returns CMD's status; cleans up always.
# Run a process on host i with:  ip netns exec P-hI CMD
set -u

PREFIX="dtn$$"
RATE=""
NHOSTS=3
SUBNET="10.213.0"

die() { echo "netns.sh: $*" >&2; exit 1; }

usage() { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//;/^set -u/d' >&2; exit 2; }

can_netns() {
  if [ "$(id -u)" != 0 ]; then
    echo "netns.sh: SKIP: needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create network namespaces" >&2
    return 77
  fi
  for t in ip tc; do
    command -v "$t" >/dev/null 2>&1 || { echo "netns.sh: SKIP: '$t' (iproute2) not installed" >&2; return 77; }
  done
  local probe="dtnprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "netns.sh: SKIP: 'ip netns add' is not permitted here (container without CAP_SYS_ADMIN?)" >&2
    return 77
  fi
  if ! ip -n "$probe" link add dtp0 type veth peer name dtp1 2>/dev/null; then
    ip netns del "$probe" 2>/dev/null
    echo "netns.sh: SKIP: veth links cannot be created here" >&2
    return 77
  fi
  ip netns del "$probe" 2>/dev/null
  return 0
}

down() {
  local i
  for ((i = 0; i < NHOSTS; i++)); do
    ip netns del "$PREFIX-h$i" 2>/dev/null
  done
  ip netns del "$PREFIX-sw" 2>/dev/null
  return 0
}

# Namespaces left by a run that was SIGKILLed (a ctest timeout kills the
# test without running its EXIT trap): names PREFIX-h<i> / PREFIX-sw whose
# prefix ends in the pid of a process that is gone and that hold no
# process. Removed before a run sets up its own.
sweep_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ "$ns" =~ ^[A-Za-z_]+([0-9]+)-(h[0-9]|sw)$ ]] || continue
    pid=${BASH_REMATCH[1]}
    [ -d "/proc/$pid" ] && continue
    [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] || continue
    ip netns del "$ns" 2>/dev/null && echo "netns.sh: removed stale namespace $ns (pid $pid is gone)" >&2
  done
  return 0
}

# Shapes egress of one device: tbf with a burst of a few MTUs and a short
# queue, so a sender sees the rate rather than a deep buffer.
shape() { # ns dev
  [ -z "$RATE" ] && return 0
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$RATE" burst 256kb latency 20ms
}

up() {
  local sw="$PREFIX-sw" i h
  ip netns add "$sw" || return 1
  ip -n "$sw" link set lo up || return 1
  ip -n "$sw" link add br0 type bridge || return 1
  ip -n "$sw" link set br0 up || return 1
  for ((i = 0; i < NHOSTS; i++)); do
    h="$PREFIX-h$i"
    ip netns add "$h" || return 1
    ip -n "$h" link set lo up || return 1
    # Create the pair inside the switch namespace, then move one end, so the
    # caller's namespace never holds either end.
    ip -n "$sw" link add "p$i" mtu 9000 type veth peer name eth0 mtu 9000 netns "$h" || return 1
    ip -n "$sw" link set "p$i" master br0 || return 1
    ip -n "$sw" link set "p$i" up || return 1
    ip -n "$h" addr add "$SUBNET.$((i + 1))/24" dev eth0 || return 1
    ip -n "$h" link set eth0 up || return 1
    shape "$h" eth0 || return 1     # host -> switch
    shape "$sw" "p$i" || return 1    # switch -> host
  done
  # Wait (bounded, ~5 s) until every link is up and every bridge port
  # forwards; there is no ping here, so check the link states.
  local tries ready
  for ((tries = 0; tries < 50; tries++)); do
    ready=1
    for ((i = 0; i < NHOSTS; i++)); do
      ip -n "$PREFIX-h$i" link show eth0 2>/dev/null | grep -q 'LOWER_UP' || ready=0
      bridge -n "$sw" link show dev "p$i" 2>/dev/null | grep -q 'state forwarding' || ready=0
    done
    [ $ready = 1 ] && return 0
    sleep 0.1
  done
  echo "netns.sh: links did not come up within 5 s" >&2
  return 1
}

cmd="${1:-}"; [ -n "$cmd" ] && shift
while [ $# -gt 0 ]; do
  case "$1" in
    -p) PREFIX="$2"; shift 2 ;;
    -r) RATE="$2"; shift 2 ;;
    -n) NHOSTS="$2"; shift 2 ;;
    --) shift; break ;;
    *) [ "$cmd" = run ] && break; usage ;;
  esac
done
[[ "$PREFIX" =~ ^[A-Za-z0-9_]{1,10}$ ]] || die "prefix must be 1..10 characters [A-Za-z0-9_]"
[[ "$NHOSTS" =~ ^[1-9]$ ]] || die "hosts must be 1..9"

case "$cmd" in
  check) can_netns; exit $? ;;
  up)
    can_netns || exit $?
    trap 'down' INT TERM
    if ! up; then down; die "setup failed; cleaned up"; fi
    hosts=""; for ((i = 0; i < NHOSTS; i++)); do hosts="$hosts $PREFIX-h$i"; done
    echo "hosts:${hosts}"
    ;;
  down) down ;;
  run)
    [ $# -gt 0 ] || usage
    can_netns || exit $?
    trap 'down' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    sweep_stale
    if ! up; then die "setup failed; cleaned up"; fi
    NETNS_HOSTS=""; NETNS_ADDRS=""
    for ((i = 0; i < NHOSTS; i++)); do
      NETNS_HOSTS="$NETNS_HOSTS $PREFIX-h$i"; NETNS_ADDRS="$NETNS_ADDRS $SUBNET.$((i + 1))"
    done
    export NETNS_HOSTS="${NETNS_HOSTS# }" NETNS_ADDRS="${NETNS_ADDRS# }" NETNS_RATE="$RATE"
    "$@"
    exit $?
    ;;
  *) usage ;;
esac

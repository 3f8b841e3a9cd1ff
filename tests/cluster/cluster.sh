# Simulated cluster on one machine (sourced by the tests/cluster scripts): N nodes as network + UTS namespaces on a private bridge.
# shellcheck shell=bash
#
# Each node is a network namespace with its own hostname (a UTS namespace) and one veth link
# (eth0, 10.254.20.<i>/24) to a bridge that lives in a namespace of its own (the "switch"), so the
# machine's own network namespace never sees a link, an address or a route of the test. The nodes
# share the file system (as a cluster shares its parallel file system), the PID space and /tmp.
# A namespace is held by a process (`unshare ... sleep LIFETIME`); it and every process inside it
# are ended by cluster_down, which the sourcing script runs from its EXIT trap. Were the test
# killed before its trap ran, the holders still end after LIFETIME seconds and the namespaces
# (with their links) vanish with the last process inside them.
#
# Functions (after `source cluster.sh`):
#   cluster_can_run          prints why not and returns 1 where namespaces cannot be made
#   cluster_up N LIFETIME    makes node1..nodeN in $CLUSTER_DIR (a fresh temporary folder)
#   cluster_down             ends every process in the nodes, the holders, removes $CLUSTER_DIR
#   on_node I CMD...         runs CMD inside node I (its network and hostname; same files)
#   node_pids I              the pids of the processes inside node I (holder excluded)
#   kill_node I              SIGKILL to every process inside node I (a node that died)
#   link_down I              takes node I's link to the switch down (a node cut off)
#   cluster_mpirun ARGS...   Open MPI's mpirun on node1 with the nodes' host list machinery
#   cluster_hydra ARGS...    MPICH's mpiexec (Hydra; $CLUSTER_MPIEXEC, default mpiexec.mpich) the same way
# Open MPI: mpirun runs on node1 (the head node) and starts its daemon on each other node through
# $CLUSTER_DIR/rsh-agent (nsenter into the node instead of ssh); --mca btl tcp,self, so ranks of
# different nodes talk over the bridge and none share memory; out-of-band and BTL traffic pinned to
# the test subnet. Hydra: mpiexec on node1 starts its proxy on each node through the same agent
# (-launcher ssh -launcher-exec); -iface eth0 gives the proxies node1's address (the node names
# resolve nowhere); MPICH tells ranks of different nodes apart by host name, so they talk over TCP.

CLUSTER_SUBNET=10.254.20
CLUSTER_DIR=""
CLUSTER_N=0
CLUSTER_HOLDERS=()  # pid of the switch's holder, then node1's, node2's, ...

cluster_can_run() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "not root: network and UTS namespaces, veth links and a bridge need root"
    return 1
  fi
  local tool
  for tool in ip unshare nsenter mpirun; do
    command -v "$tool" >/dev/null || { echo "$tool not found (scripts/install-deps.sh installs it)"; return 1; }
  done
  if ! unshare --net --uts true 2>/dev/null; then
    echo "unshare --net --uts fails here (no namespaces in this container)"
    return 1
  fi
  local probe
  probe=$(unshare --net sh -c 'ip link add dpprobe0 type veth peer name dpprobe1 && ip link add dpprobebr type bridge && echo ok' 2>&1)
  if [[ $probe != ok ]]; then
    echo "cannot make veth links and a bridge in a namespace: $probe"
    return 1
  fi
}

# _cluster_holder LIFETIME FLAGS...: starts `unshare FLAGS sleep LIFETIME` (a child of this shell),
# waits until it runs in its new namespaces, and appends its pid to CLUSTER_HOLDERS.
_cluster_holder() {
  local lifetime=$1 pid i
  shift
  unshare "$@" sleep "$lifetime" </dev/null >/dev/null 2>&1 &
  pid=$!
  CLUSTER_HOLDERS+=("$pid")
  for ((i = 0; i < 100; i++)); do
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */sleep ]] && return 0
    sleep 0.05
  done
  echo "cluster: the namespace holder $pid did not start" >&2
  return 1
}

cluster_up() {
  local n=$1 lifetime=$2 i pid sw
  CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/dp-cluster.XXXXXX")
  CLUSTER_N=$n
  CLUSTER_HOLDERS=()
  _cluster_holder "$lifetime" --net || return 1
  sw=${CLUSTER_HOLDERS[0]}
  nsenter -t "$sw" --net sh -c 'ip link set lo up && ip link add br0 type bridge &&
    ip link set br0 up' || return 1
  for ((i = 1; i <= n; i++)); do
    _cluster_holder "$lifetime" --net --uts || return 1
    pid=${CLUSTER_HOLDERS[$i]}
    echo "$pid" >"$CLUSTER_DIR/node$i.pid"
    nsenter -t "$sw" --net sh -c "ip link add port$i type veth peer name eth0 netns $pid &&
      ip link set port$i master br0 && ip link set port$i up" || return 1
    nsenter -t "$pid" --net --uts sh -c "hostname node$i && ip link set lo up &&
      ip addr add $CLUSTER_SUBNET.$i/24 dev eth0 && ip link set eth0 up" || return 1
  done
  # The agent Open MPI (as rsh) and Hydra (as ssh) call as `rsh-agent [-x] HOST COMMAND...` (the
  # command is one shell line, as ssh would run it). It enters the node by its holder's pid; it
  # never leaves this machine.
  cat >"$CLUSTER_DIR/rsh-agent" <<AGENT
#!/bin/sh
# The rsh/ssh agent of the simulated cluster: runs the command inside node HOST's namespaces.
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done  # ssh-style options: none apply
host=\$1
shift
pidfile="$CLUSTER_DIR/\$host.pid"
[ -f "\$pidfile" ] || { echo "rsh-agent: no node named '\$host' in $CLUSTER_DIR" >&2; exit 255; }
exec nsenter -t "\$(cat "\$pidfile")" --net --uts -- /bin/sh -c "\$*"
AGENT
  chmod 755 "$CLUSTER_DIR/rsh-agent"
  # The links come up asynchronously: wait until node1 reaches every node (a TCP connect to a
  # closed port is refused once the path works; bash's /dev/tcp, no ping needed).
  for ((i = 2; i <= n; i++)); do
    local t
    for ((t = 0; t < 50; t++)); do
      [[ $(on_node 1 timeout 1 bash -c "exec 3<>/dev/tcp/$CLUSTER_SUBNET.$i/9" 2>&1) == *refused* ]] &&
        break
      sleep 0.1
    done
  done
}

node_ns() { readlink "/proc/${CLUSTER_HOLDERS[$1]}/ns/net" 2>/dev/null; }

node_pids() {
  local ns p
  ns=$(node_ns "$1")
  [[ -n $ns ]] || return 0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p != "${CLUSTER_HOLDERS[$1]}" && $(readlink "/proc/$p/ns/net" 2>/dev/null) == "$ns" ]] &&
      echo "$p"
  done
}

on_node() {
  local i=$1
  shift
  nsenter -t "${CLUSTER_HOLDERS[$i]}" --net --uts -- "$@"
}

kill_node() {
  local p
  for p in $(node_pids "$1"); do kill -KILL "$p" 2>/dev/null; done
}

link_down() {
  nsenter -t "${CLUSTER_HOLDERS[0]}" --net ip link set "port$1" down
}

# The out-of-band keepalive (idle 5 s, then 3 probes 2 s apart; Open MPI's default is 300 s, 20 s
# and 9) lets mpirun notice a node whose link is gone within about 11 s and end the job.
# --bind-to none (CLUSTER_BIND overrides): the nodes share this machine's cores, and Open MPI's
# default binds each node's first rank to core 0, the same core on every node.
cluster_mpirun() {
  # shellcheck disable=SC2054  # tcp,self is one argument
  local flags=(--mca plm_rsh_agent "$CLUSTER_DIR/rsh-agent" --mca btl tcp,self --mca pml ob1
    --mca btl_tcp_if_include "$CLUSTER_SUBNET.0/24" --mca oob_tcp_if_include "$CLUSTER_SUBNET.0/24"
    --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3
    --bind-to "${CLUSTER_BIND:-none}" --oversubscribe)
  [[ $(id -u) -eq 0 ]] && flags+=(--allow-run-as-root)
  on_node 1 mpirun "${flags[@]}" "$@"
}

cluster_hydra() {
  on_node 1 "${CLUSTER_MPIEXEC:-mpiexec.mpich}" -launcher ssh -launcher-exec "$CLUSTER_DIR/rsh-agent" \
    -iface eth0 "$@"
}

cluster_down() {
  local i p round
  ((${#CLUSTER_HOLDERS[@]})) || return 0
  # Processes inside the nodes (mpirun, orted, ranks): TERM, then KILL what is left after 3 s.
  for round in TERM KILL; do
    local left=0
    for ((i = 1; i <= CLUSTER_N; i++)); do
      for p in $(node_pids "$i"); do
        kill -"$round" "$p" 2>/dev/null && left=1
      done
    done
    ((left)) || break
    [[ $round == TERM ]] && for ((i = 0; i < 30; i++)); do
      local any=0
      for ((p = 1; p <= CLUSTER_N; p++)); do [[ -n $(node_pids "$p") ]] && any=1; done
      ((any)) || break
      sleep 0.1
    done
  done
  for p in "${CLUSTER_HOLDERS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${CLUSTER_HOLDERS[@]}"; do wait "$p" 2>/dev/null; done
  CLUSTER_HOLDERS=()
  [[ -n $CLUSTER_DIR ]] && rm -rf "$CLUSTER_DIR"
  CLUSTER_DIR=""
}

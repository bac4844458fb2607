# Shared paths and helpers for the local cluster scripts. Sourced, not run.
# shellcheck shell=bash
set -euo pipefail

CLUSTER_SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$CLUSTER_SCRIPTS_DIR/../.." && pwd)
# shellcheck source=versions.sh
source "$CLUSTER_SCRIPTS_DIR/versions.sh"

SANDPOD_CACHE=${SANDPOD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandpod}
STATE_DIR=${SANDPOD_CLUSTER_DIR:-$REPO_ROOT/.cluster}
RUN_DIR=$STATE_DIR/run
LOG_DIR=$STATE_DIR/logs
PID_DIR=$STATE_DIR/pids
PKI_DIR=$STATE_DIR/pki
KUBECONFIG_ADMIN=$STATE_DIR/kubeconfig
CONTAINERD_SOCK=$RUN_DIR/containerd.sock
CNI_BIN_DIR=$STATE_DIR/cni/bin
CNI_CONF_DIR=$STATE_DIR/cni/net.d
VENV=${SANDPOD_VENV:-$REPO_ROOT/.venv}

NODE_NAME=sandpod-node
POD_CIDR=10.244.0.0/24
POD_GATEWAY=10.244.0.1
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SERVICE_IP=10.96.0.1
DNS_SERVICE_IP=10.96.0.10
CNI_BRIDGE=cni0
# `make run` serves the gateway here; the target (its Service's address) is kept in state so
# that `cluster-up` after a `cluster-down` serves it again.
GATEWAY_ADDRESS=127.0.0.1:8080
GATEWAY_FORWARD_TARGET=$STATE_DIR/gateway-forward-target
# The pids hierarchy groups every process the cluster starts (daemons, shims, sandboxes, pods),
# so `cluster-down` can find and stop each one by PID.
CLUSTER_CGROUP=sandpod-cluster
PIDS_CGROUP=/sys/fs/cgroup/pids/$CLUSTER_CGROUP

# process_alive PID: true while PID runs. An exited daemon is reparented to PID 1, which may
# leave it a zombie for a while; a zombie has stopped, so it counts as gone.
process_alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# apt-get as every script of the project runs it: while another apt-get or dpkg (a second
# `make`, unattended-upgrades) holds apt's lock, it waits, up to APT_LOCK_TIMEOUT seconds,
# instead of failing at once, and says so. apt's own DPkg::Lock::Timeout covers the dpkg lock
# (install), silently at -qq; apt 2.6 (Debian 12) does not apply it to the lists lock (update),
# so a run refused a lock is run again every 5 s until the deadline. Named apt-get so that
# sourcing this file is all a script needs: build.sh calls it unchanged (an edit of build.sh
# would rebuild every cluster component, its text being part of their cache key).
APT_LOCK_TIMEOUT=${APT_LOCK_TIMEOUT:-600}
APT_LOCK_FILES=${APT_LOCK_FILES:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock}
apt-get() {
  local deadline=$((SECONDS + APT_LOCK_TIMEOUT)) status errors holder told=
  while :; do
    if [ -z "$told" ]; then
      holder=$(apt_lock_holder)
      [ -z "$holder" ] || { apt_waits "$holder"; told=1; }
    fi
    status=0
    # stdout as usual; stderr kept to tell a lock refusal from another error.
    { errors=$(command apt-get -o "DPkg::Lock::Timeout=$((deadline > SECONDS ? deadline - SECONDS : 0))" \
      "$@" 2>&1 1>&3 3>&-); } 3>&1 || status=$?
    if [ "$status" -ne 0 ] && [ "$SECONDS" -lt "$deadline" ] && [[ $errors == *"Could not get lock"* ]]; then
      if [ -z "$told" ]; then
        holder=${errors#*Could not get lock }
        apt_waits "${holder%%$'\n'*}"
        told=1
      fi
      sleep 5
      continue
    fi
    [ -z "$errors" ] || printf '%s\n' "$errors" >&2
    return "$status"
  done
}

apt_waits() {
  printf '[apt %s] waiting (up to %ss) for another apt-get or dpkg to let go of its lock: %s\n' \
    "$(date +%H:%M:%S)" "$APT_LOCK_TIMEOUT" "$1" >&2
}

# apt_lock_holder: "FILE, held by process PID (COMMAND)" for the first of APT_LOCK_FILES a process
# holds a lock on (by /proc/locks, where a lock is named by its file's device and inode), else
# nothing.
apt_lock_holder() {
  local file major minor inode pid
  for file in $APT_LOCK_FILES; do
    read -r major minor inode < <(stat -c '%Hd %Ld %i' "$file" 2>/dev/null) || continue
    pid=$(awk -v id="$(printf '%02x:%02x:%s' "$major" "$minor" "$inode")" \
      '$6 == id { print $5; exit }' /proc/locks)
    if [ -n "$pid" ]; then
      printf '%s, held by process %s (%s)\n' "$file" "$pid" "$(cat "/proc/$pid/comm" 2>/dev/null || echo '?')"
      return
    fi
  done
}

# Directory of a built component in the cache: <name>-<version>-<hash of its pins, patches and
# the build script (which holds the build flags)>.
component_dir() {
  local name=$1 version=$2 pins_hash
  pins_hash=$({
    cat "$CLUSTER_SCRIPTS_DIR/gomod/$name/go.mod" "$CLUSTER_SCRIPTS_DIR/gomod/$name/go.sum"
    cat "$CLUSTER_SCRIPTS_DIR"/patches/"$name"-*.patch 2>/dev/null || true
    cat "$CLUSTER_SCRIPTS_DIR/build.sh"
  } | sha256sum | cut -c1-12)
  printf '%s/bin/%s-%s-%s\n' "$SANDPOD_CACHE" "$name" "$version" "$pins_hash"
}

node_ip() {
  ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit }}'
}

kubectl_admin() { "$(component_dir kubernetes "$KUBERNETES_VERSION")/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

daemon_running() {
  local pid_file=$PID_DIR/$1.pid
  [ -f "$pid_file" ] && process_alive "$(cat "$pid_file")"
}

# start_daemon NAME COMMAND...: runs COMMAND detached, logging to .cluster/logs/NAME.log. The
# process joins the cluster's pids cgroup before it execs, so it and every child it ever
# forks (shims, sandboxes) can be found again by `cluster-down`.
start_daemon() {
  local name=$1
  shift
  daemon_running "$name" && return 0
  setsid bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$PIDS_CGROUP" "$@" \
    </dev/null >>"$LOG_DIR/$name.log" 2>&1 &
  echo $! >"$PID_DIR/$name.pid"
}

# start_gateway_forward: serves GATEWAY_ADDRESS on the host once `make run` has named a target.
# socat forks one relay per connection to the gateway Service (through kube-proxy's rules), so
# a connection that breaks ends only itself, never the listener. Its default listen backlog (5)
# drops connections under a burst (300 at once); backlog=4096 (the kernel caps it at
# net.core.somaxconn) queues them for the gateway to answer, with a 429 if it must. socat sets
# no limit on its children unless given max-children.
start_gateway_forward() {
  [ -s "$GATEWAY_FORWARD_TARGET" ] || return 0
  start_daemon gateway-forward socat \
    "TCP-LISTEN:${GATEWAY_ADDRESS##*:},bind=${GATEWAY_ADDRESS%:*},fork,reuseaddr,backlog=4096" \
    "TCP:$(cat "$GATEWAY_FORWARD_TARGET")"
}

# stop_daemon NAME: TERM, up to 15 s, then KILL; by the PID in its pid file.
stop_daemon() {
  local name=$1 pid_file=$PID_DIR/$1.pid pid
  daemon_running "$name" || { rm -f "$pid_file"; return 0; }
  pid=$(cat "$pid_file")
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 15))
  while process_alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pid_file"
}

# wait_for DESCRIPTION SECONDS DAEMON COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local description=$1 seconds=$2 daemon=$3
  shift 3
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$daemon" ] && ! daemon_running "$daemon"; then
      tail -n 30 "$LOG_DIR/$daemon.log" >&2 || true
      die "$daemon exited while waiting for $description (log: $LOG_DIR/$daemon.log)"
    fi
    [ $SECONDS -lt $deadline ] || die "timed out after ${seconds}s waiting for $description"
    sleep 0.2
  done
}

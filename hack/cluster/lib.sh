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

# Directory of a built component in the cache: <name>-<version>-<hash of its pins>.
component_dir() {
  local name=$1 version=$2 pins_hash
  pins_hash=$(cat "$CLUSTER_SCRIPTS_DIR/gomod/$name/go.mod" "$CLUSTER_SCRIPTS_DIR/gomod/$name/go.sum" \
    "$CLUSTER_SCRIPTS_DIR"/patches/"$name"-*.patch 2>/dev/null | sha256sum | cut -c1-12)
  printf '%s/bin/%s-%s-%s\n' "$SANDPOD_CACHE" "$name" "$version" "$pins_hash"
}

node_ip() {
  ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit }}'
}

kubectl_admin() { "$(component_dir kubernetes "$KUBERNETES_VERSION")/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

#!/usr/bin/env bash
# Stops the local cluster: every process `cluster-up` started (by PID, from .cluster/pids and
# the cluster's pids cgroup), and the interfaces, iptables rules and mounts it made.
# Cluster state (etcd data, images, certificates) stays in .cluster/ for the next `up`.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

K8S_BIN=$(component_dir kubernetes "$KUBERNETES_VERSION")

# Pods are deleted through the kubelet first, so each sandbox's network is torn down by CNI.
stop_pods() {
  daemon_running kube-apiserver && daemon_running kubelet || return 0
  log "deleting every pod"
  local namespaces
  namespaces=$(kubectl_admin get namespaces -o name 2>/dev/null | cut -d/ -f2) || return 0
  local namespace
  for namespace in $namespaces; do
    kubectl_admin delete pods --all -n "$namespace" --grace-period=0 --force --wait=false \
      >/dev/null 2>&1 || true
  done
  local deadline=$((SECONDS + 60))
  while [ -n "$(ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks ls -q 2>/dev/null)" ]; do
    [ $SECONDS -lt $deadline ] || { log "pods still running after 60 s; killing them"; break; }
    sleep 0.5
  done
}

# Every process left in the cluster's cgroups: shims, gVisor sandboxes, containers.
kill_remaining_processes() {
  local round pids
  for round in 1 2 3 4 5; do
    pids=$({ find "$PIDS_CGROUP" /sys/fs/cgroup/pids/kubepods -name cgroup.procs -exec cat {} + \
      2>/dev/null || true; } | sort -u)
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.3
  done
  log "warning: processes left in the cluster cgroups: $pids"
}

remove_network() {
  ip link del "$CNI_BRIDGE" 2>/dev/null || true
  # kube-proxy's own cleanup removes its KUBE-* chains.
  [ -x "$K8S_BIN/kube-proxy" ] && "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  if [ -x "$VENV/bin/python" ]; then
    PYTHONPATH="$CLUSTER_SCRIPTS_DIR" "$VENV/bin/python" -m sandpod_netpol cleanup >/dev/null 2>&1 || true
  fi
  # What kube-proxy's cleanup leaves: kubelet's KUBE-* chains (firewall, canaries) and the
  # CNI plugins' CNI-* chains, in every table and both address families.
  local iptables table
  for iptables in iptables ip6tables; do
    for table in filter nat mangle; do
      remove_chains "$iptables" "$table" '^(KUBE|CNI)-'
    done
  done
  rm -rf "$STATE_DIR/cni/ipam"
}

# remove_chains IPTABLES TABLE REGEX: unhooks, flushes and deletes the chains whose names match.
remove_chains() {
  local iptables=$1 table=$2 pattern=$3 chains chain rule
  chains=$("$iptables" -t "$table" -S 2>/dev/null | awk -v p="$pattern" '$1 == "-N" && $2 ~ p { print $2 }')
  [ -n "$chains" ] || return 0
  "$iptables" -t "$table" -S 2>/dev/null | awk -v p="$pattern" '$1 == "-A" && $2 !~ p && / -j / {
      for (i = 1; i < NF; i++) if ($i == "-j" && $(i + 1) ~ p) { $1 = "-D"; print; break } }' \
    | while read -r rule; do eval "$iptables -t $table $rule" 2>/dev/null || true; done
  for chain in $chains; do "$iptables" -t "$table" -F "$chain" 2>/dev/null || true; done
  for chain in $chains; do "$iptables" -t "$table" -X "$chain" 2>/dev/null || true; done
}

unmount_state() {
  local mount_point
  # Deepest first: kubelet volume mounts, containerd's overlay rootfs and shm mounts, runsc.
  for mount_point in $(awk -v state="$STATE_DIR" -v run=/run/sandpod \
    'index($2, state "/") == 1 || index($2, run "/") == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount -l "$mount_point" 2>/dev/null || true
  done
  rm -rf /run/sandpod
}

main() {
  [ -d "$STATE_DIR" ] || { log "no cluster state at $STATE_DIR; nothing to stop"; return 0; }
  local daemon
  # Controllers would replace the pods that stop_pods deletes: stop them first.
  for daemon in gateway-forward kube-controller-manager kube-scheduler; do
    stop_daemon "$daemon"
  done
  stop_pods
  for daemon in coredns kube-proxy kubelet netpol kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do
    stop_daemon "$daemon"
  done
  kill_remaining_processes
  remove_network
  unmount_state
  rmdir "$PIDS_CGROUP" 2>/dev/null || true
  log "cluster stopped (state kept in $STATE_DIR; delete it for a fresh cluster)"
}

main "$@"

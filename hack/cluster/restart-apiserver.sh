#!/usr/bin/env bash
# Restarts the local cluster's kube-apiserver, for fault tests: SIGKILL to the PID in
# .cluster/pids/kube-apiserver.pid, optionally stays down for a while, then starts it again with
# the arguments it ran with (read from /proc before the kill) and waits for /readyz. The binary
# is the current build's: the one it was started from may have left the cache since.
#
#   hack/cluster/restart-apiserver.sh [--down-seconds N]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

down_seconds=0
while [ $# -gt 0 ]; do
  case $1 in
    --down-seconds) down_seconds=${2:?--down-seconds needs a number}; shift 2 ;;
    *) die "usage: $0 [--down-seconds N]" ;;
  esac
done

daemon_running kube-apiserver || die "kube-apiserver is not running (start the cluster with make cluster-up)"
pid=$(cat "$PID_DIR/kube-apiserver.pid")
mapfile -d '' command_line <"/proc/$pid/cmdline"
[ "${#command_line[@]}" -gt 1 ] || die "cannot read the command line of kube-apiserver ($pid)"
command_line[0]="$(component_dir kubernetes "$KUBERNETES_VERSION")/kube-apiserver"
[ -x "${command_line[0]}" ] || die "no kube-apiserver at ${command_line[0]}: run hack/cluster/build.sh"

log "killing kube-apiserver ($pid)"
kill -KILL "$pid"
deadline=$((SECONDS + 30))
while process_alive "$pid"; do
  [ $SECONDS -lt $deadline ] || die "kube-apiserver ($pid) survived SIGKILL for 30 s"
  sleep 0.1
done
sleep "$down_seconds"

log "starting kube-apiserver again"
start_daemon kube-apiserver "${command_line[@]}"
wait_for "the API server's /readyz" 90 kube-apiserver kubectl_admin get --raw /readyz
log "kube-apiserver is back ($(cat "$PID_DIR/kube-apiserver.pid"))"

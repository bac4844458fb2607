#!/usr/bin/env bash
# Starts a real single-node Kubernetes cluster as plain processes (as Kubernetes'
# local-up-cluster does): containerd + runc + CNI bridge, gVisor (RuntimeClass gvisor), etcd,
# the control plane, kubelet, kube-proxy, CoreDNS and a NetworkPolicy enforcer.
# All state lives under .cluster/; `cluster-down` stops every process this starts.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

K8S_BIN=$(component_dir kubernetes "$KUBERNETES_VERSION")
GVISOR_BIN=$(component_dir gvisor "$GVISOR_VERSION")
COREDNS_BIN=$(component_dir coredns "$COREDNS_VERSION")
PAUSE_IMAGE=localhost/sandpod/pause:3.10
TESTBOX_IMAGE=localhost/sandpod/testbox:1
RUNSC_ROOT=/run/sandpod/runsc
CONTAINERD_STATE=/run/sandpod/containerd
NETPOL_SOCKET=/run/sandpod/netpol.sock
NODE_IP=$(node_ip)
DAEMONS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler netpol kubelet kube-proxy coredns)

preflight() {
  [ "$(id -u)" -eq 0 ] || die "the local cluster runs containerd and kubelet, which need root"
  [ -x "$K8S_BIN/kube-apiserver" ] && [ -x "$GVISOR_BIN/runsc" ] && [ -x "$COREDNS_BIN/coredns" ] \
    || die "components are not built yet: run hack/cluster/build.sh (make cluster-build)"
  [ -n "$NODE_IP" ] || die "no IPv4 default route: cannot pick the node address"
  [ -x "$VENV/bin/python" ] || die "the project venv is missing: run make venv"
  local socket_path_limit=100
  [ ${#CONTAINERD_SOCK} -lt $socket_path_limit ] || die "repo path too deep for a unix socket: $CONTAINERD_SOCK"
}

prepare_host() {
  mkdir -p "$RUN_DIR" "$LOG_DIR" "$PID_DIR" "$PKI_DIR" "$STATE_DIR/kubeconfigs" "$CNI_BIN_DIR" \
    "$CNI_CONF_DIR" "$STATE_DIR/containerd" "$STATE_DIR/kubelet" "$STATE_DIR/etcd" "$RUNSC_ROOT" \
    "$CONTAINERD_STATE" "$LOG_DIR/runsc"
  mkdir -p "$PIDS_CGROUP"
  sysctl -qw net.ipv4.ip_forward=1
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || ip link add sandpod-brnf type bridge 2>/dev/null || true
  ip link del sandpod-brnf 2>/dev/null || true
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
  # Debian's CNI plugins plus the NetworkPolicy enforcer's chained plugin, in one bin dir.
  local plugin
  for plugin in /usr/lib/cni/*; do ln -sfn "$plugin" "$CNI_BIN_DIR/$(basename "$plugin")"; done
  install -m 0755 "$CLUSTER_SCRIPTS_DIR/sandpod_netpol/cni_plugin.py" "$CNI_BIN_DIR/sandpod-netpol"
}

# issue_cert NAME SUBJECT [SUBJECT_ALT_NAMES]: a key and a certificate signed by the cluster CA.
issue_cert() {
  local name=$1 subject=$2 sans=${3:-}
  [ -f "$PKI_DIR/$name.crt" ] && return 0
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI_DIR/$name.key" 2>/dev/null
  openssl req -new -key "$PKI_DIR/$name.key" -subj "$subject" -out "$PKI_DIR/$name.csr" 2>/dev/null
  local extensions=$PKI_DIR/$name.ext
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$sans" ]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$sans"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$extensions"
  openssl x509 -req -in "$PKI_DIR/$name.csr" -CA "$PKI_DIR/ca.crt" -CAkey "$PKI_DIR/ca.key" \
    -CAcreateserial -days 3650 -sha256 -extfile "$extensions" -out "$PKI_DIR/$name.crt" 2>/dev/null
  rm -f "$PKI_DIR/$name.csr" "$extensions"
}

# write_kubeconfig PATH CERT_NAME: a kubeconfig with the CA and client certificate embedded.
write_kubeconfig() {
  local path=$1 cert=$2
  cat >"$path" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sandpod
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: $(base64 -w0 <"$PKI_DIR/ca.crt")
users:
- name: $cert
  user:
    client-certificate-data: $(base64 -w0 <"$PKI_DIR/$cert.crt")
    client-key-data: $(base64 -w0 <"$PKI_DIR/$cert.key")
contexts:
- name: sandpod
  context: {cluster: sandpod, user: $cert}
current-context: sandpod
EOF
  chmod 600 "$path"
}

generate_pki() {
  if ! [ -f "$PKI_DIR/ca.crt" ]; then
    log "generating certificates and kubeconfigs"
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI_DIR/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$PKI_DIR/ca.key" -subj "/CN=sandpod-local-ca" -days 3650 \
      -sha256 -out "$PKI_DIR/ca.crt" 2>/dev/null
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI_DIR/service-accounts.key" 2>/dev/null
    openssl ec -in "$PKI_DIR/service-accounts.key" -pubout -out "$PKI_DIR/service-accounts.pub" 2>/dev/null
  fi
  # The node address is in the serving certificates: a new address means new certificates.
  if [ "$(cat "$PKI_DIR/node-ip" 2>/dev/null)" != "$NODE_IP" ]; then
    rm -f "$PKI_DIR/kube-apiserver.crt" "$PKI_DIR/kubelet.crt"
    echo "$NODE_IP" >"$PKI_DIR/node-ip"
  fi
  issue_cert kube-apiserver "/CN=kube-apiserver" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$KUBERNETES_SERVICE_IP,IP:$NODE_IP"
  issue_cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
  issue_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  issue_cert admin "/O=system:masters/CN=sandpod-admin"
  issue_cert kube-controller-manager "/CN=system:kube-controller-manager"
  issue_cert kube-scheduler "/CN=system:kube-scheduler"
  issue_cert kube-proxy "/CN=system:kube-proxy"
  issue_cert coredns "/CN=system:coredns"
  issue_cert netpol "/CN=sandpod:netpol-enforcer"
  write_kubeconfig "$KUBECONFIG_ADMIN" admin
  local component
  for component in kubelet kube-controller-manager kube-scheduler kube-proxy coredns netpol; do
    write_kubeconfig "$STATE_DIR/kubeconfigs/$component.kubeconfig" "$component"
  done
}

write_configs() {
  cat >"$STATE_DIR/containerd/runsc.toml" <<EOF
binary_name = "$GVISOR_BIN/runsc"
root = "$RUNSC_ROOT"
log_path = "$LOG_DIR/runsc/shim-%ID%.log"
[runsc_config]
  platform = "systrap"
EOF
  cat >"$STATE_DIR/containerd/config.toml" <<EOF
version = 2
root = "$STATE_DIR/containerd/root"
state = "$CONTAINERD_STATE"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE_DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Without CAP_SYS_RESOURCE on this machine, runc cannot lower oom_score_adj below its own.
  restrict_oom_score_adj = true
  # Pod network namespaces are mounted under containerd's state dir (/run/sandpod), not the
  # host's /run/netns: "ip netns add" by any other tool bind-mounts /run/netns over itself,
  # hiding earlier mounts there so that they can be neither unmounted nor removed.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$STATE_DIR/containerd/runsc.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$CNI_CONF_DIR"
EOF
  cat >"$CNI_CONF_DIR/10-sandpod.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "sandpod",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE_DIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "sandpod-netpol", "socket": "$NETPOL_SOCKET", "timeoutSeconds": 60}
  ]
}
EOF
  cat >"$STATE_DIR/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 only; Kubernetes 1.34 still runs there when told to.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
address: $NODE_IP
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI_DIR/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI_DIR/kubelet.crt
tlsPrivateKeyFile: $PKI_DIR/kubelet.key
clusterDomain: cluster.local
clusterDNS: [$DNS_SERVICE_IP]
resolvConf: /etc/resolv.conf
failSwapOn: false
serializeImagePulls: false
# Images are imported locally and can never be pulled again: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "200Mi", nodefs.available: "1%", imagefs.available: "1%"}
podPidsLimit: 4096
maxPods: 110
containerLogMaxSize: 20Mi
syncFrequency: 10s
fileCheckFrequency: 0s
EOF
  cat >"$STATE_DIR/kube-proxy-config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE_DIR/kubeconfigs/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $CLUSTER_CIDR
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0}
EOF
  cat >"$STATE_DIR/Corefile" <<EOF
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE_DIR/kubeconfigs/coredns.kubeconfig sandpod
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
}
EOF
}

# import_rootfs_image NAME ROOTFS_DIR ENTRYPOINT_JSON: a one-layer docker-archive tarball made
# here and imported into containerd; no image can be pulled on this machine.
import_rootfs_image() {
  local name=$1 rootfs=$2 entrypoint=$3
  local ctr=(ctr --address "$CONTAINERD_SOCK" -n k8s.io)
  "${ctr[@]}" images ls -q | grep -qx "$name" && return 0
  local work
  work=$(mktemp -d)
  tar -C "$rootfs" --owner=0 --group=0 --numeric-owner --sort=name --mtime=@0 -cf "$work/layer.tar" .
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"User":"65532:65532"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$entrypoint" "$(sha256sum "$work/layer.tar" | cut -d' ' -f1)" >"$work/config.json"
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$name" >"$work/manifest.json"
  tar -C "$work" -cf "$work/image.tar" manifest.json config.json layer.tar
  "${ctr[@]}" images import "$work/image.tar" >/dev/null
  rm -rf "$work"
}

import_cluster_images() {
  local rootfs
  rootfs=$(mktemp -d)
  install -m 0755 "$(ls "$SANDPOD_CACHE"/bin/pause-*/pause | head -n 1)" "$rootfs/pause"
  import_rootfs_image "$PAUSE_IMAGE" "$rootfs" '["/pause"]'
  rm -rf "$rootfs"
  # A busybox image for the cluster's own tests (network checks, gVisor checks, OOM).
  rootfs=$(mktemp -d)
  mkdir -p "$rootfs/bin" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp"
  install -m 0755 /bin/busybox "$rootfs/bin/busybox"
  local applet
  for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
  done
  import_rootfs_image "$TESTBOX_IMAGE" "$rootfs" '["/bin/sh"]'
  rm -rf "$rootfs"
}

# Debian's containerd 1.6 reads a bare socket address from a shim's `start`; gVisor's current
# shim (built on containerd 2's shim library) prints the JSON bootstrap parameters that
# containerd 2 reads. This adapter, first on containerd's PATH, hands 1.6 the address.
write_runsc_shim_adapter() {
  mkdir -p "$STATE_DIR/bin"
  cat >"$STATE_DIR/bin/containerd-shim-runsc-v1" <<ADAPTER
#!/bin/bash
shim=$GVISOR_BIN/containerd-shim-runsc-v1
if [ "\${*: -1}" != start ]; then exec "\$shim" "\$@"; fi
bootstrap=\$("\$shim" "\$@") || exit
address=\${bootstrap#*'"address":"'}
printf '%s' "\${address%%'"'*}"
ADAPTER
  chmod 0755 "$STATE_DIR/bin/containerd-shim-runsc-v1"
  ln -sfn "$K8S_BIN/kubectl" "$STATE_DIR/bin/kubectl"
  ln -sfn "$(component_dir helm "$HELM_VERSION")/helm" "$STATE_DIR/bin/helm"
}

start_containerd() {
  log "starting containerd (runc and gVisor runsc on the systrap platform)"
  write_runsc_shim_adapter
  start_daemon containerd env PATH="$STATE_DIR/bin:$PATH" containerd --config "$STATE_DIR/containerd/config.toml"
  wait_for "containerd" 30 containerd ctr --address "$CONTAINERD_SOCK" version
  import_cluster_images
}

start_control_plane() {
  log "starting etcd $ETCD_VERSION"
  start_daemon etcd "$K8S_BIN/etcd" --name sandpod --data-dir "$STATE_DIR/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster sandpod=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn
  wait_for "etcd" 30 etcd curl -fsS http://127.0.0.1:2379/health

  log "starting kube-apiserver $KUBERNETES_VERSION on $NODE_IP:6443"
  start_daemon kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --advertise-address="$NODE_IP" --bind-address=0.0.0.0 --secure-port=6443 \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --client-ca-file="$PKI_DIR/ca.crt" \
    --tls-cert-file="$PKI_DIR/kube-apiserver.crt" --tls-private-key-file="$PKI_DIR/kube-apiserver.key" \
    --kubelet-client-certificate="$PKI_DIR/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI_DIR/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI_DIR/ca.crt" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI_DIR/service-accounts.pub" \
    --service-account-signing-key-file="$PKI_DIR/service-accounts.key" \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true --profiling=false --v=1
  wait_for "the API server's /readyz" 90 kube-apiserver kubectl_admin get --raw /readyz

  start_daemon kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$STATE_DIR/kubeconfigs/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$STATE_DIR/kubeconfigs/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$STATE_DIR/kubeconfigs/kube-controller-manager.kubeconfig" \
    --service-account-private-key-file="$PKI_DIR/service-accounts.key" \
    --root-ca-file="$PKI_DIR/ca.crt" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$PKI_DIR/ca.crt" --cluster-signing-key-file="$PKI_DIR/ca.key" \
    --leader-elect=false --bind-address=127.0.0.1 --profiling=false --v=1
  start_daemon kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig="$STATE_DIR/kubeconfigs/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$STATE_DIR/kubeconfigs/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$STATE_DIR/kubeconfigs/kube-scheduler.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --profiling=false --v=1
}

# A ClusterRoleBinding $1 of the ClusterRole $2 to the user $3 (a client certificate's CN).
user_role_binding() {
  cat <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: $1
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: $2}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: $3}
EOF
}

apply_bootstrap_manifests() {
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
handler: runsc
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
$(user_role_binding system:coredns system:coredns system:coredns)
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: sandpod:netpol-enforcer
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
---
$(user_role_binding sandpod:netpol-enforcer sandpod:netpol-enforcer sandpod:netpol-enforcer)
---
$(user_role_binding sandpod:kube-proxy system:node-proxier system:kube-proxy)
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: $DNS_SERVICE_IP
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
# CoreDNS runs on the host, not in a pod: the Service points at the node address.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: sandpod-local-cluster
addressType: IPv4
endpoints:
- addresses: [$NODE_IP]
  conditions: {ready: true}
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
EOF
}

start_node() {
  log "starting the NetworkPolicy enforcer"
  daemon_running netpol || rm -f "$NETPOL_SOCKET"
  start_daemon netpol env PYTHONPATH="$CLUSTER_SCRIPTS_DIR" "$VENV/bin/python" -m sandpod_netpol run \
    --kubeconfig "$STATE_DIR/kubeconfigs/netpol.kubeconfig" --node-name "$NODE_NAME" \
    --pod-cidr "$POD_CIDR" --bridge "$CNI_BRIDGE" --socket "$NETPOL_SOCKET"
  # The CNI plugin holds each pod's network setup until the enforcer has programmed its rules.
  wait_for "the NetworkPolicy enforcer's socket" 30 netpol test -S "$NETPOL_SOCKET"
  log "starting kubelet and kube-proxy"
  start_daemon kubelet "$K8S_BIN/kubelet" --config="$STATE_DIR/kubelet-config.yaml" \
    --kubeconfig="$STATE_DIR/kubeconfigs/kubelet.kubeconfig" --root-dir="$STATE_DIR/kubelet" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1
  start_daemon kube-proxy "$K8S_BIN/kube-proxy" --config="$STATE_DIR/kube-proxy-config.yaml" --v=1
  start_daemon coredns "$COREDNS_BIN/coredns" -conf "$STATE_DIR/Corefile"
}

node_ready() {
  [ "$(kubectl_admin get node "$NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

print_usage() {
  cat <<EOF

The local cluster is up: Kubernetes $KUBERNETES_VERSION, node $NODE_NAME ($NODE_IP), RuntimeClass gvisor.
  export KUBECONFIG=$KUBECONFIG_ADMIN PATH=$STATE_DIR/bin:\$PATH   # kubectl and helm
  kubectl get nodes
Logs: $LOG_DIR/   Stop it: make cluster-down
EOF
}

main() {
  preflight
  if daemon_running kube-apiserver && daemon_running kubelet && node_ready; then
    log "the cluster is already running (KUBECONFIG=$KUBECONFIG_ADMIN); nothing to do"
    start_gateway_forward
    return 0
  fi
  local started=$SECONDS
  prepare_host
  generate_pki
  write_configs
  start_containerd
  start_control_plane
  apply_bootstrap_manifests
  start_node
  wait_for "node $NODE_NAME to be Ready" 120 kubelet node_ready
  wait_for "the default service account" 60 kube-controller-manager kubectl_admin get serviceaccount default
  start_gateway_forward
  log "cluster up in $((SECONDS - started)) s"
  print_usage
}

main "$@"

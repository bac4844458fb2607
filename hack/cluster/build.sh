#!/usr/bin/env bash
# Installs the Debian packages the local cluster needs and builds, once, every Go component
# (Kubernetes, etcd, gVisor, CoreDNS, Helm) at its pinned version into a per-user cache.
# A second run finds everything in the cache and builds nothing.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

APT_PACKAGES=(containerd runc patch containernetworking-plugins iptables ipset conntrack openssl
  socat ethtool iproute2 util-linux ebtables kmod procps curl gcc libc6-dev netcat-openbsd busybox-static)

install_apt_packages() {
  local missing=()
  for package in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts containerd as a service on install; the cluster runs its own instance.
  if [ -f /run/containerd/containerd.pid ] && ! [ -S "$CONTAINERD_SOCK" ]; then
    kill "$(cat /run/containerd/containerd.pid)" 2>/dev/null || true
  fi
}

# go_build NAME VERSION CGO LDFLAGS OUTPUT=PACKAGE...: builds into the cache unless already there.
# All packages go through one `go build` so shared dependencies compile once; `go build -v`
# names each package as it compiles, and that count against the dependency total is the
# progress shown for builds that take many minutes on two cores.
go_build() {
  local name=$1 version=$2 cgo=$3 ldflags=$4
  shift 4
  local out_dir module_dir
  out_dir=$(component_dir "$name" "$version")
  module_dir=$CLUSTER_SCRIPTS_DIR/gomod/$name
  [ -f "$out_dir/.complete" ] && return 0
  if compgen -G "$CLUSTER_SCRIPTS_DIR/patches/$name-*.patch" >/dev/null; then
    module_dir=$(patched_module "$name" "$version")
  fi
  local packages=() spec
  for spec in "$@"; do packages+=("${spec#*=}"); done
  local total started
  total=$(cd "$module_dir" && go list -deps "${packages[@]}" | wc -l)
  started=$(date +%s)
  log "building $name $version: ${#packages[@]} binaries, $total packages (a cold build takes minutes; then cached)"
  rm -rf "$out_dir.partial"
  mkdir -p "$out_dir.partial"
  (cd "$module_dir" && CGO_ENABLED=$cgo go build -trimpath -v -ldflags "$ldflags" \
    -o "$out_dir.partial/" "${packages[@]}") 2>&1 \
    | awk -v name="$name" -v total="$total" '
        /^#|\.go:[0-9]+:/ { print > "/dev/stderr" }
        { compiled++; if (compiled % 250 == 0) printf "[cluster] %s: compiled %d of at most %d packages\n", name, compiled, total > "/dev/stderr" }'
  for spec in "$@"; do
    local output=${spec%%=*} package=${spec#*=}
    local built=$out_dir.partial/${package##*/}
    [ -x "$built" ] || die "building $package failed (see above)"
    [ "$built" = "$out_dir.partial/$output" ] || mv "$built" "$out_dir.partial/$output"
  done
  rm -rf "$out_dir"
  mv "$out_dir.partial" "$out_dir"
  touch "$out_dir/.complete"
  log "built $name in $(($(date +%s) - started)) s into $out_dir"
  local stale
  for stale in "$SANDPOD_CACHE/bin/$name"-*; do
    [ "$stale" = "$out_dir" ] || rm -rf "$stale"
  done
}

# patched_module NAME VERSION: a copy of the wrapper module whose dependency NAME's module
# (the one it requires at VERSION) is replaced by a copy of its source with patches/NAME-*.patch
# applied. Prints the copy's directory.
patched_module() {
  local name=$1 version=$2 wrapper=$CLUSTER_SCRIPTS_DIR/gomod/$name
  local module_path
  module_path=$(awk '$1 == "require" && NF == 3 { print $2; exit }' "$wrapper/go.mod")
  local work=$SANDPOD_CACHE/src/$name-$version-patched
  rm -rf "$work"
  mkdir -p "$work"
  local source_dir
  source_dir=$(cd "$wrapper" && go mod download -json "$module_path@$version" | awk -F'"' '$2 == "Dir" { print $4 }')
  cp -r "$source_dir" "$work/source"
  chmod -R u+w "$work/source"
  local patch
  for patch in "$CLUSTER_SCRIPTS_DIR"/patches/"$name"-*.patch; do
    patch -s -p1 -d "$work/source" <"$patch" || die "patch $patch does not apply to $module_path@$version"
  done
  cp -r "$wrapper" "$work/module"
  (cd "$work/module" && go mod edit -replace "$module_path=$work/source")
  echo "$work/module"
}

build_kubernetes() {
  local minor=${KUBERNETES_VERSION#v1.}
  minor=${minor%%.*}
  local ldflags="-s -w"
  ldflags+=" -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=1"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  go_build kubernetes "$KUBERNETES_VERSION" 1 "$ldflags" \
    kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
    kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
    kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
    kubelet=k8s.io/kubernetes/cmd/kubelet \
    kube-proxy=k8s.io/kubernetes/cmd/kube-proxy \
    kubectl=k8s.io/kubernetes/cmd/kubectl \
    etcd=./cmd/etcd
}

build_pause() {
  local out_dir=$SANDPOD_CACHE/bin/pause-$(sha256sum "$CLUSTER_SCRIPTS_DIR/pause.c" | cut -c1-12)
  [ -x "$out_dir/pause" ] && return 0
  mkdir -p "$out_dir"
  gcc -Os -static -o "$out_dir/pause.partial" "$CLUSTER_SCRIPTS_DIR/pause.c"
  strip "$out_dir/pause.partial"
  mv "$out_dir/pause.partial" "$out_dir/pause"
}

main() {
  command -v go >/dev/null || die "Go is required (https://go.dev/dl); it builds every component"
  install_apt_packages
  build_pause
  build_kubernetes
  go_build gvisor "$GVISOR_VERSION" 0 "-s -w" \
    runsc=gvisor.dev/gvisor/runsc \
    containerd-shim-runsc-v1=gvisor.dev/gvisor/shim
  go_build coredns "$COREDNS_VERSION" 0 "-s -w" coredns=github.com/coredns/coredns
  # Helm's own build stamps the Kubernetes version it assumes for `helm template` and lint.
  local helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  local package minor=${KUBERNETES_VERSION#v1.}
  for package in pkg/lint/rules pkg/chartutil; do
    helm_ldflags+=" -X helm.sh/helm/v3/$package.k8sVersionMajor=1"
    helm_ldflags+=" -X helm.sh/helm/v3/$package.k8sVersionMinor=${minor%%.*}"
  done
  go_build helm "$HELM_VERSION" 0 "$helm_ldflags" \
    helm=helm.sh/helm/v3/cmd/helm
  log "all components built; cache: $SANDPOD_CACHE/bin ($(du -sh "$SANDPOD_CACHE/bin" | cut -f1))"
}

main "$@"

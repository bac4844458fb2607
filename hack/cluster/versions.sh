# Pinned versions of every component the local cluster is built from.
# Changing one changes the cache key, so the next `cluster-up` rebuilds only that piece.
KUBERNETES_VERSION=v1.34.4
ETCD_VERSION=v3.6.4   # the etcd server that Kubernetes 1.34's own go.mod pins
HELM_VERSION=v3.19.5
GVISOR_VERSION=v0.0.0-20260905035102-160fafc42237   # gVisor's `go` branch
COREDNS_VERSION=v1.13.2

"""Where things are: the repository, the build cache (as hack/cluster/lib.sh names it), the
CRDs and the local cluster's kubeconfig."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = REPO_ROOT / ".venv" / "bin"
CRDS_DIR = REPO_ROOT / "crds"
CRD_PATH = CRDS_DIR / "codeexecutions.sandpod.dev.yaml"
POOL_CRD_PATH = CRDS_DIR / "sandboxpools.sandpod.dev.yaml"
CACHE_DIR = Path(
    os.environ.get(
        "SANDPOD_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sandpod"
    )
)


def default_kubeconfig() -> Path:
    """$KUBECONFIG, else the local cluster's (`make cluster-up`)."""
    return Path(os.environ.get("KUBECONFIG") or REPO_ROOT / ".cluster" / "kubeconfig")


def kube_bin_dir() -> Path | None:
    """$SANDPOD_KUBE_BIN_DIR, else the newest Kubernetes build `make cluster-build` made
    (kube-apiserver, etcd, kubectl); None when there is none."""
    if os.environ.get("SANDPOD_KUBE_BIN_DIR"):
        return Path(os.environ["SANDPOD_KUBE_BIN_DIR"])
    builds = sorted(
        CACHE_DIR.glob("bin/kubernetes-*/kube-apiserver"), key=lambda path: path.stat().st_mtime
    )
    return builds[-1].parent if builds else None

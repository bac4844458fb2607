"""A private etcd + kube-apiserver from the local cluster's Kubernetes build: no scheduler,
kubelet or controller manager, so nothing runs and the tests play every other part. Used by
the integration tests; it never touches the shared cluster."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandpod_testkit.paths import kube_bin_dir
from sandpod_testkit.processes import ChildProcess, free_port
from sandpod_testkit.waiting import wait_until

TOKEN = "private-api-server-token"


def require_kube_bin_dir() -> Path:
    """The Kubernetes build's binaries; missing ones are a failure, never a skip."""
    bin_dir = kube_bin_dir()
    if bin_dir is None or not (bin_dir / "etcd").exists():
        pytest.fail(
            "no kube-apiserver/etcd build (make cluster-build, or set SANDPOD_KUBE_BIN_DIR)"
        )
    return bin_dir


def _unwrapped(argv: list[str]) -> list[str]:
    return argv


class PrivateApiServer:
    """etcd and kube-apiserver (token auth, AlwaysAllow) serving on `address`:`api_port`,
    their logs and kubeconfig in `workdir`. `wrap` turns a command into the one to run (for
    example inside a network namespace): the servers and kubectl all run through it."""

    def __init__(
        self,
        bin_dir: Path,
        workdir: Path,
        *,
        address: str = "127.0.0.1",
        api_port: int | None = None,
        service_cidr: str = "10.97.0.0/16",
        wrap: Callable[[list[str]], list[str]] = _unwrapped,
    ) -> None:
        self.bin_dir = bin_dir
        self.workdir = workdir
        self.address = address
        self.api_port = api_port or free_port()
        self.service_cidr = service_cidr
        self.wrap = wrap
        self.kubeconfig = workdir / "kubeconfig"
        self.processes: list[ChildProcess] = []

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.api_port}"

    def start(self) -> None:
        work = self.workdir
        subprocess.run(
            ["openssl", "genrsa", "-out", str(work / "sa.key"), "2048"],
            check=True,
            capture_output=True,
        )
        (work / "tokens.csv").write_text(f'{TOKEN},admin,admin,"system:masters"\n')
        etcd_url = f"http://127.0.0.1:{free_port()}"
        peer_url = f"http://127.0.0.1:{free_port()}"
        self._spawn(
            "etcd",
            f"--data-dir={work / 'etcd'}",
            "--unsafe-no-fsync",
            "--log-level=error",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
        )
        self._spawn(
            "kube-apiserver",
            f"--etcd-servers={etcd_url}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--secure-port={self.api_port}",
            f"--cert-dir={work / 'certs'}",
            f"--token-auth-file={work / 'tokens.csv'}",
            "--authorization-mode=AlwaysAllow",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={work / 'sa.key'}",
            f"--service-account-signing-key-file={work / 'sa.key'}",
            f"--service-cluster-ip-range={self.service_cidr}",
        )
        self.kubeconfig.write_text(json.dumps(self._kubeconfig()))
        wait_until(
            lambda: self.kubectl_ok("get", "--raw", "/readyz"), timeout=60, what="the API server"
        )

    def start_controllers(self, *controllers: str) -> None:
        """kube-controller-manager running only `controllers` (e.g. resourcequota) against
        this API server; stopped with it."""
        self._spawn(
            "kube-controller-manager",
            f"--kubeconfig={self.kubeconfig}",
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
        )

    def _kubeconfig(self) -> dict[str, Any]:
        cluster = {"server": self.url, "insecure-skip-tls-verify": True}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "private",
            "clusters": [{"name": "private", "cluster": cluster}],
            "users": [{"name": "admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": "private", "context": {"cluster": "private", "user": "admin"}}],
        }

    def _spawn(self, binary: str, *args: str) -> None:
        command = self.wrap([str(self.bin_dir / binary), *args])
        process = ChildProcess(binary, command, None, self.workdir / f"{binary}.log")
        self.processes.append(process)
        process.spawn()

    def stop(self) -> None:
        for process in reversed(self.processes):  # the API server before its etcd
            process.stop()

    def kubectl_run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        command = self.wrap(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        )
        return subprocess.run(command, input=stdin, capture_output=True, text=True)

    def kubectl_ok(self, *args: str, stdin: str | None = None) -> bool:
        return self.kubectl_run(*args, stdin=stdin).returncode == 0

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = self.kubectl_run(*args, stdin=stdin)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def apply(self, *objects: dict[str, Any]) -> None:
        items = list(objects)
        self.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )

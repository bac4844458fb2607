"""sandpod as users install it: a release of charts/sandpod on the test cluster, and its
components (operator, gateway, egress proxy) as the Deployments the chart made. Tests stop,
kill, pause and start those pods, and talk to the gateway through its Service."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import httpx2
import yaml
from kubernetes import client
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sandpod_testkit.paths import REPO_ROOT
from sandpod_testkit.quotas import wait_for_quotas
from sandpod_testkit.waiting import wait_until

CHART = REPO_ROOT / "charts" / "sandpod"
HELM_TIMEOUT = "5m"
# Pod start under gVisor plus the program; generous, the tests never wait this long on success.
REQUEST_TIMEOUT = 180.0
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The kubelet's cgroupfs layout (hack/cluster/up.sh): a pod's cgroup by its QoS class.
QOS_CGROUPS = {"Guaranteed": "kubepods", "Burstable": "kubepods/burstable"}


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` laid over `base`, dictionaries merged key by key (as Helm merges values)."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def new_api_key() -> tuple[str, str]:
    """A fresh API key and its SHA-256 digest (what the tenants config stores)."""
    key = f"sk-{secrets.token_urlsafe(24)}"
    return key, hashlib.sha256(key.encode()).hexdigest()


def helm_run(
    helm: Path, kubeconfig: Path, namespace: str, *args: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """`helm ARGS --namespace NAMESPACE`; RuntimeError (with its output) when it fails."""
    command = [str(helm), *args, "--namespace", namespace]
    completed = subprocess.run(
        [*command, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stdout}\n{completed.stderr}")
    return completed


@dataclass
class ChartRelease:
    """A release of the chart named `name` in `namespace`; every object is named after the
    release alone (fullnameOverride), e.g. `<name>-operator`."""

    helm: Path
    kubeconfig: Path
    api_client: client.ApiClient
    name: str
    namespace: str
    values: dict[str, Any]
    workdir: Path

    def helm_run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return helm_run(self.helm, self.kubeconfig, self.namespace, *args)

    def install(self) -> None:
        """`helm upgrade --install --wait` with `values` (so also an upgrade), then until the
        tenant namespaces' ResourceQuotas are counted (creates there succeed)."""
        values_file = self.workdir / f"values-{self.name}.yaml"
        values_file.write_text(yaml.safe_dump({**self.values, "fullnameOverride": self.name}))
        self.helm_run(
            "upgrade", "--install", self.name, str(CHART), "--create-namespace",
            "--values", str(values_file), "--wait", "--timeout", HELM_TIMEOUT,
        )  # fmt: skip
        wait_for_quotas(client.CoreV1Api(self.api_client), *self.tenant_namespaces)

    @property
    def tenant_namespaces(self) -> set[str]:
        """The namespaces of the chart's tenants (`tenants` in the values)."""
        return {
            tenant.get("namespace") or tenant["name"] for tenant in self.values.get("tenants", [])
        }

    def uninstall(self) -> None:
        """`helm uninstall` (its hook releases what the operator served), then the namespace."""
        self.helm_run("uninstall", self.name, "--wait", "--timeout", HELM_TIMEOUT)
        core = client.CoreV1Api(self.api_client)
        with suppress(client.ApiException):
            core.delete_namespace(self.namespace, propagation_policy="Background")

    def component(self, component: str, replicas: int = 1) -> Deployed:
        return Deployed(self, component, replicas)

    def gateway(self) -> DeployedGateway:
        default = yaml.safe_load((CHART / "values.yaml").read_text())["gateway"]["replicas"]
        replicas = int(self.values.get("gateway", {}).get("replicas", default))
        return DeployedGateway(self, "gateway", replicas)

    @property
    def operator_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}-operator"

    @property
    def gateway_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}-gateway"


@contextmanager
def installed(release: ChartRelease) -> Iterator[ChartRelease]:
    """The release installed for the block, uninstalled after it."""
    try:
        release.install()
        yield release
    finally:
        release.uninstall()


@dataclass
class Deployed:
    """One component of a release: its Deployment `<release>-<component>` and its pods."""

    release: ChartRelease
    component: str
    replicas: int = 1

    @property
    def name(self) -> str:
        return f"{self.release.name}-{self.component}"

    @property
    def selector(self) -> str:
        instance = f"app.kubernetes.io/instance={self.release.name}"
        return f"{instance},app.kubernetes.io/component={self.component}"

    @property
    def core_v1(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.release.api_client)

    def pods(self) -> list[Any]:
        """Its pods that are not being deleted."""
        return [pod for pod in self.all_pods() if pod.metadata.deletion_timestamp is None]

    def scale(self, replicas: int) -> None:
        client.AppsV1Api(self.release.api_client).patch_namespaced_deployment_scale(
            self.name, self.release.namespace, {"spec": {"replicas": replicas}}
        )

    def ready(self) -> bool:
        """All `replicas` pods ready, and no other pod of it left (not even terminating)."""
        pods = self.all_pods()
        return len(pods) == self.replicas and all(
            pod.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
            for pod in pods
        )

    def wait_ready(self, timeout: float = 180) -> None:
        wait_until(self.ready, timeout=timeout, what=f"{self.name} to be ready", interval=0.5)

    def start(self) -> None:
        """Scaled back to `replicas`, ready; also after `stop` or `kill`."""
        self.scale(self.replicas)
        self.wait_ready()

    def stop(self) -> None:
        """Scaled to 0, its pods ended the way Kubernetes ends them (SIGTERM first)."""
        self.scale(0)
        self.wait_gone()

    def all_pods(self) -> list[Any]:
        """Its pods, those being deleted too."""
        listed: Any = self.core_v1.list_namespaced_pod(
            self.release.namespace, label_selector=self.selector
        )
        return list(listed.items)

    def wait_gone(self) -> None:
        wait_until(lambda: not self.all_pods(), timeout=120, what=f"{self.name}'s pods to go")

    def kill(self) -> None:
        """A crash: every process of its pods frozen at once, then SIGKILLed, so it finishes
        nothing; the Deployment stays at 0 until `start`. On any error it is started again."""
        pods = self.pods()
        try:
            with frozen(pods):
                self.scale(0)
                for pod in pods:
                    signal_processes(pod, signal.SIGKILL)
            for pod in pods:
                with suppress(client.ApiException):
                    self.core_v1.delete_namespaced_pod(
                        pod.metadata.name, self.release.namespace, grace_period_seconds=0
                    )
            self.wait_gone()
        except BaseException:
            self.start()
            raise

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Its pods frozen (the cgroup freezer: no signal it could see) for the block."""
        with frozen(self.pods()):
            yield

    def log_tail(self, lines: int = 60) -> str:
        tails = []
        for pod in self.pods():
            with suppress(client.ApiException):
                log = self.core_v1.read_namespaced_pod_log(
                    pod.metadata.name, self.release.namespace, tail_lines=lines
                )
                tails.append(f"--- {pod.metadata.name}\n{log}")
        return "\n".join(tails)


@dataclass
class DeployedGateway(Deployed):
    """The gateway: its Service for requests, its keys Secret for tenants."""

    @cached_property
    def url(self) -> str:
        service: Any = self.core_v1.read_namespaced_service(self.name, self.release.namespace)
        return f"http://{service.spec.cluster_ip}:{service.spec.ports[0].port}"

    def wait_ready(self, timeout: float = 180) -> None:
        """Its pods ready, and its Service answering (its endpoints reach kube-proxy later)."""
        super().wait_ready(timeout)
        wait_until(self.serving, timeout=timeout, what=f"{self.url} to answer", interval=0.5)

    def serving(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def pod_urls(self) -> list[str]:
        port = int(self.release.values.get("gateway", {}).get("port", 8080))
        return [f"http://{pod.status.pod_ip}:{port}" for pod in self.pods()]

    def add_tenant(
        self, name: str, namespace: str, *, lint: dict[str, list[str]] | None = None, **limits: Any
    ) -> str:
        """A new tenant (or a new key for it) serving `namespace`, with the gateway's tenant
        role bound there as the chart binds it, and its own lint rules if given; returns its
        key once every replica accepts it."""
        key, digest = new_api_key()
        self.bind_tenant_namespace(namespace)
        secret = f"{self.release.name}-api-keys"
        tenants = keys_secret_tenants(self.core_v1, secret, self.release.namespace)
        tenants[name] = {
            "namespace": namespace,
            "limits": limits,
            "apiKeys": [{"name": "e2e", "sha256": digest}],
            **({"lint": lint} if lint is not None else {}),
        }
        self.core_v1.patch_namespaced_secret(
            secret,
            self.release.namespace,
            {"stringData": {"tenants.yaml": yaml.safe_dump({"tenants": tenants})}},
        )
        for url in self.pod_urls():
            with httpx.Client(base_url=url, headers=bearer(key), timeout=10) as probe:
                wait_until(
                    lambda probe=probe: probe.get("/v1/languages").status_code == 200,
                    timeout=60,
                    what=f"{url} to accept the key of tenant {name}",
                )
        return key

    def bind_tenant_namespace(self, namespace: str) -> None:
        binding = client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=f"{self.name}-tenant"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io",
                kind="ClusterRole",
                name=f"{self.release.namespace}-{self.name}-tenant",
            ),
            subjects=[
                client.RbacV1Subject(
                    kind="ServiceAccount", name=self.name, namespace=self.release.namespace
                )
            ],
        )
        rbac = client.RbacAuthorizationV1Api(self.release.api_client)
        try:
            rbac.create_namespaced_role_binding(namespace, binding)
        except client.ApiException as error:
            if error.status != 409:
                raise

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(key), timeout=REQUEST_TIMEOUT)

    @asynccontextmanager
    async def mcp(self, key: str) -> AsyncIterator[Client]:
        """An MCP client of the gateway's /mcp, presenting ``key``."""
        http = httpx2.AsyncClient(headers=bearer(key), timeout=REQUEST_TIMEOUT)
        async with http, Client(streamable_http_client(f"{self.url}/mcp", http_client=http)) as mcp:
            yield mcp


def keys_secret_tenants(core_v1: client.CoreV1Api, name: str, namespace: str) -> dict[str, Any]:
    secret: Any = core_v1.read_namespaced_secret(name, namespace)
    config = yaml.safe_load(base64.b64decode(secret.data["tenants.yaml"]).decode()) or {}
    return dict(config.get("tenants") or {})


# --- the node's view of a pod: its cgroups and processes ----------------------------------------


def pod_cgroup(controller: str, pod: Any) -> Path | None:
    """The pod's cgroup directory in `controller`'s hierarchy, found by its QoS class and uid
    (never by walking the tree, which the kubelet changes under a walker); None once gone."""
    parent = QOS_CGROUPS.get(pod.status.qos_class, "kubepods/besteffort")
    path = CGROUP_ROOT / controller / parent / f"pod{pod.metadata.uid}"
    return path if path.is_dir() else None


def pod_processes(pod: Any) -> list[int]:
    """The pids of every process in the pod's containers (sandbox pause included)."""
    directory = pod_cgroup("pids", pod)
    if directory is None:
        return []
    pids: list[int] = []
    with suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if entry.is_dir(follow_symlinks=False):
                with suppress(FileNotFoundError, ProcessLookupError):
                    procs = Path(entry.path, "cgroup.procs").read_text()
                    pids.extend(int(line) for line in procs.split())
    return pids


def signal_processes(pod: Any, signum: signal.Signals) -> None:
    for pid in pod_processes(pod):
        with suppress(ProcessLookupError):
            os.kill(pid, signum)


def freezer_state(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


@contextmanager
def frozen(pods: list[Any]) -> Iterator[None]:
    """Every process of `pods` stopped by the cgroup freezer for the block, thawed after."""
    states = [path / "freezer.state" for pod in pods if (path := pod_cgroup("freezer", pod))]
    try:
        for state in states:
            state.write_text("FROZEN")
        for state in states:
            wait_until(
                lambda state=state: freezer_state(state) in ("FROZEN", None),
                timeout=30,
                what=f"{state} to be FROZEN",
                interval=0.05,
            )
        yield
    finally:
        for state in states:
            with suppress(FileNotFoundError):
                state.write_text("THAWED")

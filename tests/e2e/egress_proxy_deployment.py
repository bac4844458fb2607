"""The chart's egress proxy (templates/egress-proxy.yaml, image egress-proxy) deployed by a test
module in a namespace of its own, and an operator of the module's own pointed at it: for
tests/hostile/test_egress_by_host_name.py and tests/e2e/test_gateway_egress.py."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, utils
from operator_process import OPENED_TEST_NETWORK, e2e_operator
from sandpod_testkit.components import OperatorProcess
from sandpod_testkit.kube import cluster_ranges, create_namespace
from sandpod_testkit.paths import REPO_ROOT
from sandpod_testkit.waiting import wait_until

PROXY_NAME = "sandpod-egress-proxy"


@dataclass(frozen=True)
class DeployedProxy:
    namespace: str
    labels: dict[str, str]  # its pods'
    key: bytes  # the grant key it shares with the operator


def render_proxy(helm: Path, namespace: str, values: dict[str, Any], workdir: Path) -> list[Any]:
    values_file = workdir / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    rendered = subprocess.run(
        [str(helm), "template", "sandpod", str(REPO_ROOT / "charts" / "sandpod"),
         "--namespace", namespace, "--values", str(values_file),
         "--show-only", "templates/egress-proxy.yaml"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    return [document for document in yaml.safe_load_all(rendered) if document]


def proxy_ready(apps: client.AppsV1Api, namespace: str) -> bool:
    deployment: Any = apps.read_namespaced_deployment(PROXY_NAME, namespace)
    return bool(deployment.status.ready_replicas)


@contextmanager
def deployed_proxy(
    api_client: client.ApiClient,
    helm: Path,
    namespace: str,
    node_ip: str,
    workdir: Path,
    host_aliases: list[dict[str, Any]] | None = None,
) -> Iterator[DeployedProxy]:
    """The chart's egress proxy in `namespace` (made here, deleted after), its names from
    `host_aliases` only (the chart gives it no DNS), its monitor open to this machine (where
    the operator runs)."""
    core_v1 = client.CoreV1Api(api_client)
    create_namespace(core_v1, namespace)
    ranges = cluster_ranges(api_client)
    values = {
        "egress": {
            "openCidrs": [OPENED_TEST_NETWORK],
            "nodeCidrs": ranges["nodes"],
            "podCidrs": ranges["pods"],
            "serviceCidrs": ranges["services"],
            "apiServerCidrs": ranges["apiServer"],
        },
        "egressProxy": {"hostAliases": host_aliases or []},
        "networkPolicies": {"ingressFrom": [{"ipBlock": {"cidr": f"{node_ip}/32"}}]},
    }
    documents = render_proxy(helm, namespace, values, workdir)
    try:
        for document in documents:
            utils.create_from_dict(api_client, document, namespace=namespace)
        apps = client.AppsV1Api(api_client)
        wait_until(lambda: proxy_ready(apps, namespace), timeout=120, what="the egress proxy")
        secret = next(d for d in documents if d["kind"] == "Secret")
        deployment = next(d for d in documents if d["kind"] == "Deployment")
        yield DeployedProxy(
            namespace=namespace,
            labels=deployment["spec"]["selector"]["matchLabels"],
            key=base64.b64decode(secret["data"]["key"]),
        )
    finally:
        core_v1.delete_namespace(namespace, propagation_policy="Background")


def proxy_operator(
    kubeconfig_path: Path,
    api_client: client.ApiClient,
    namespace_patterns: list[str],
    proxy: DeployedProxy,
    workdir: Path,
    namespace_hosts: dict[str, list[str]],
) -> OperatorProcess:
    """The e2e operator (not started) with `proxy` as its egress proxy; `namespace_hosts`
    narrows the hosts of those namespaces (a tenant's egress.allowedHosts)."""
    key_file = workdir / "proxy-key"
    key_file.write_bytes(proxy.key)
    operator = e2e_operator(
        kubeconfig_path, namespace_patterns, workdir, cluster_ranges(api_client)
    )
    operator.env.update(
        {
            "SANDPOD_EGRESS_PROXY_SERVICE": f"{proxy.namespace}/{PROXY_NAME}",
            "SANDPOD_EGRESS_PROXY_POD_LABELS": json.dumps(proxy.labels),
            "SANDPOD_EGRESS_PROXY_KEY_FILE": str(key_file),
            "SANDPOD_EGRESS_NAMESPACE_HOSTS": json.dumps(namespace_hosts),
        }
    )
    return operator

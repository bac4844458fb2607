"""The operator the cluster tests run on this machine, and the settings they rely on."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from kubernetes import client
from sandpod_testkit.components import OperatorProcess
from sandpod_testkit.kube import cluster_ranges
from sandpod_testkit.paths import REPO_ROOT

# Settings the operator's own e2e tests rely on: a RuntimeClass that the operator allows but
# the cluster lacks, a language whose image does not exist, memory limits above the node's.
MISSING_RUNTIME_CLASS = "sandpod-missing-runtime"
MISSING_IMAGE_LANGUAGE = "missing-image"
MISSING_IMAGE = "localhost/sandpod/does-not-exist:0.0.0"
# The fake hosts of tests/hostile live in TEST-NET-3, which the egress rule public-only refuses:
# the operator opens it, as an administrator opens a test network.
OPENED_TEST_NETWORK = "203.0.113.0/24"


def e2e_operator(
    kubeconfig_path: Path,
    namespace_patterns: list[str],
    workdir: Path,
    cluster_ranges: dict[str, list[str]],
) -> OperatorProcess:
    """The operator (not started) with the settings above, watching `namespace_patterns`,
    with egress bounds that exclude the cluster's own ranges (sandpod_testkit.kube)."""
    catalog = yaml.safe_load(
        (REPO_ROOT / "contract" / "sandpod_contract" / "catalog.yaml").read_text()
    )
    catalog["languages"][MISSING_IMAGE_LANGUAGE] = {
        "image": MISSING_IMAGE,
        "file": "main.sh",
        "command": ["sh", "main.sh"],
    }
    catalog_path = workdir / "catalog.yaml"
    catalog_path.write_text(yaml.safe_dump(catalog))
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig_path),
        "SANDPOD_CATALOG_PATH": str(catalog_path),
        "SANDPOD_ALLOWED_RUNTIME_CLASSES": json.dumps([MISSING_RUNTIME_CLASS]),
        "SANDPOD_MAX_MEMORY": "64Gi",
        "SANDPOD_UNSCHEDULABLE_GRACE_SECONDS": "2",
        "SANDPOD_EGRESS_OPEN_CIDRS": json.dumps([OPENED_TEST_NETWORK]),
        "SANDPOD_EGRESS_NODE_CIDRS": json.dumps(cluster_ranges["nodes"]),
        "SANDPOD_EGRESS_POD_CIDRS": json.dumps(cluster_ranges["pods"]),
        "SANDPOD_EGRESS_SERVICE_CIDRS": json.dumps(cluster_ranges["services"]),
        "SANDPOD_EGRESS_API_SERVER_CIDRS": json.dumps(cluster_ranges["apiServer"]),
    }
    return OperatorProcess(
        env=env, namespaces=namespace_patterns, log_path=workdir / "operator.log"
    )


@contextmanager
def operator_reaching_runners(
    kind: str, kubeconfig_path: Path, core_v1: client.CoreV1Api, workdir: Path
) -> Iterator[tuple[OperatorProcess, str]]:
    """A started operator of its own, watching `<kind>-<id>-*` only (the prefix it yields),
    which lets this machine (the node's address) reach the serving runners' port."""
    prefix = f"{kind}-{uuid.uuid4().hex[:6]}"
    ranges = cluster_ranges(core_v1.api_client)
    operator = e2e_operator(kubeconfig_path, [f"{prefix}-*"], workdir, ranges)
    node = core_v1.list_node().items[0]
    node_ip = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    assert operator.env is not None
    operator.env["SANDPOD_RUNNER_INGRESS_FROM"] = json.dumps(
        [{"ipBlock": {"cidr": f"{node_ip}/32"}}]
    )
    operator.start()
    try:
        yield operator, prefix
    finally:
        operator.stop()

"""The chart's egress admission policy on the cluster: `kubectl apply` of an allowlist outside
the platform's bounds is refused by the API server, naming the rule (and so is the gateway's
create: a 422 with the API server's message).

Only the policy's objects are rendered (helm template --show-only) and applied, bound to this
test's namespace alone; requests are server-side dry runs, so nothing is created.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_release import DeployedGateway
from executions import applied_policy, kubectl, manifest
from kubernetes import client
from sandpod_testkit.kube import cluster_ranges

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "sandpod"
# Public-looking ranges listed as the cluster's own (the local cluster's are all private, so
# the public-only rule would answer first): the cluster-network rule must catch them.
FAKE_POD_NETWORK = "8.21.0.0/16"
OPENED = "203.0.113.0/24"
NARROWED_TO = ["1.1.1.0/24", OPENED]


def render_policy(helm: Path, namespace: str, values: dict[str, Any], workdir: Path) -> str:
    values_file = workdir / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    command = [str(helm), "template", "egress", str(CHART), "--namespace", namespace]
    command += ["--values", str(values_file), "--show-only", "templates/egress-policy.yaml"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def dry_run(kubeconfig: Path, namespace: str, cidrs: list[str]) -> subprocess.CompletedProcess[str]:
    spec = {
        "language": "python",
        "source": "print(1)",
        "network": {"egress": "allowlist", "allow": [{"cidr": cidr} for cidr in cidrs]},
    }
    document = json.dumps(manifest("reach", spec))
    return kubectl(
        kubeconfig, "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=document
    )


@pytest.fixture
def egress_policy(
    namespace: str,
    sandpod_crd: str,
    helm: Path,
    kubeconfig_path: Path,
    api_client: client.ApiClient,
    tmp_path: Path,
) -> Iterator[dict[str, list[str]]]:
    ranges = cluster_ranges(api_client)
    values = {
        "tenants": [
            {
                "name": "narrowed",
                "namespace": namespace,
                "createNamespace": False,
                "egress": {"allowedCidrs": NARROWED_TO},
            }
        ],
        "operator": {"watchNamespaces": [namespace]},
        "egress": {
            "nodeCidrs": ranges["nodes"],
            "podCidrs": [*ranges["pods"], FAKE_POD_NETWORK],
            "serviceCidrs": ranges["services"],
            "apiServerCidrs": ranges["apiServer"],
            "openCidrs": [OPENED],
        },
    }
    rendered = render_policy(helm, namespace, values, tmp_path)
    with applied_policy(
        kubeconfig_path,
        rendered,
        takes_effect=lambda: (
            "egress rule tenant" in dry_run(kubeconfig_path, namespace, ["8.8.8.8/32"]).stderr
        ),
        what="the egress admission policy to take effect",
    ):
        yield ranges


@pytest.mark.parametrize(
    ("cidr", "names"),
    [
        ("0.0.0.0/0", "overlaps 0.0.0.0/8 (this network); egress rule public-only"),
        ("169.254.169.254/32", "cloud metadata 169.254.169.254); egress rule public-only"),
        ("127.0.0.1/32", "(loopback); egress rule public-only"),
        ("10.0.0.0/8", "egress rule public-only"),
        ("::/0", "overlaps ::1/128 (loopback); egress rule public-only"),
        ("fe80::/10", "(link-local); egress rule public-only"),
        ("8.21.3.4/32", f"{FAKE_POD_NETWORK} (the pod network); egress rule cluster-network"),
        ("8.8.8.8/32", "egress rule tenant: an allowlist in this namespace may name only"),
    ],
)
def test_kubectl_apply_outside_the_bounds_is_refused(
    cidr: str, names: str, namespace: str, kubeconfig_path: Path, egress_policy: Any
) -> None:
    result = dry_run(kubeconfig_path, namespace, ["1.1.1.1/32", cidr])
    assert result.returncode != 0, result.stdout
    assert f"spec.network.allow: {cidr} " in result.stderr, result.stderr
    assert names in result.stderr, result.stderr


def test_the_cluster_itself_is_refused(
    namespace: str, kubeconfig_path: Path, egress_policy: dict[str, list[str]]
) -> None:
    for kind in ("nodes", "pods", "services", "apiServer"):
        for cidr in egress_policy[kind]:
            result = dry_run(kubeconfig_path, namespace, [cidr])
            assert result.returncode != 0, (kind, result.stdout)
            assert f"spec.network.allow: {cidr} overlaps " in result.stderr, result.stderr


def test_kubectl_apply_within_the_bounds_is_accepted(
    namespace: str, kubeconfig_path: Path, egress_policy: Any
) -> None:
    result = dry_run(kubeconfig_path, namespace, ["1.1.1.1/32", "203.0.113.10/32"])
    assert result.returncode == 0, result.stderr


def test_the_gateway_answers_an_allowlist_the_policy_refuses_with_422_naming_the_rule(
    namespace: str, gateway: DeployedGateway, egress_policy: Any
) -> None:
    key = gateway.add_tenant(namespace, namespace)
    network = {"egress": "allowlist", "allow": [{"cidr": "10.0.0.0/8"}]}
    with gateway.client(key) as http:
        response = http.post(
            "/v1/executions", json={"language": "python", "code": "print(1)", "network": network}
        )

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_execution"
    assert "spec.network.allow: 10.0.0.0/8 overlaps " in error["message"]
    assert "egress rule public-only" in error["message"]

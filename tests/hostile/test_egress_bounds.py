"""Egress is bounded by the platform, not by the requester: allowlists naming the cluster, the
metadata address or everything are refused, whoever creates them; one naming a host inside the
range the administrator opened (the session operator opens TEST-NET-3, where the fake public
host lives) reaches that host and nothing else.

The session release has the chart's admission policy, so the API server refuses these at
create (422, naming the rule; nothing is created). The operator's own refusal (Error/InvalidSpec
before any child exists) is checked on a release without the policy:
tests/e2e/test_chart_settings.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from corpus import TCP_PROBE
from executions import create, create_refused, status, wait_for
from fake_hosts import LISTEN_PORT, METADATA_ADDRESS, PUBLIC_ADDRESS, FakeHosts, NetworkControl
from kubernetes import client
from results_table import Row
from sandpod_testkit.kube import cluster_ranges

pytestmark = pytest.mark.usefixtures("sandpod_operator")

CLUSTER_DNS = "10.96.0.10"  # the local cluster's DNS Service (hack/cluster)

# (case, allowlist entry, the rule the refusal must name); {node}, {pods}, {api} are filled in.
REFUSED = (
    ("everything", "0.0.0.0/0", "public-only"),
    ("everything-ipv6", "::/0", "public-only"),
    ("api-server", "{api}", "egress rule "),
    ("cloud-metadata", f"{METADATA_ADDRESS}/32", "public-only"),
    ("pod-network", "{pods}", "egress rule "),
    ("node", "{node}", "egress rule "),
    ("cluster-dns", f"{CLUSTER_DNS}/32", "egress rule "),
    ("loopback", "127.0.0.1/32", "public-only"),
    ("link-local-ipv6", "fe80::/10", "public-only"),
    ("private-network", "10.0.0.0/8", "public-only"),
)


@pytest.fixture(scope="module")
def cluster(api_client: client.ApiClient) -> dict[str, str]:
    ranges = cluster_ranges(api_client)
    return {"node": ranges["nodes"][0], "pods": ranges["pods"][0], "api": ranges["apiServer"][0]}


@pytest.mark.parametrize(("case", "cidr", "rule"), REFUSED, ids=[case for case, _, _ in REFUSED])
def test_out_of_bounds_allowlist_is_refused(
    case: str,
    cidr: str,
    rule: str,
    cluster: dict[str, str],
    hostile_namespace: str,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
    table_row: Row,
) -> None:
    entry = cidr.format(**cluster)
    table_row.expected = f"refused at create (422) naming {rule.strip()}, nothing created"
    message = create_refused(
        custom_objects,
        hostile_namespace,
        "reach",
        language="python",
        source=TCP_PROBE,
        args=[f"{entry.split('/')[0]}:53"],
        network={"egress": "allowlist", "allow": [{"cidr": "1.1.1.1/32"}, {"cidr": entry}]},
    )
    table_row.observed = f"422: {message[:70]}"
    assert f"spec.network.allow: {entry} overlaps " in message, message
    assert rule in message, message
    assert not core_v1.list_namespaced_pod(hostile_namespace).items


def test_allowlist_reaches_only_the_opened_host(
    hostile_namespace: str,
    custom_objects: client.CustomObjectsApi,
    fake_hosts: FakeHosts,
    network_control: NetworkControl,
    node_ip: str,
    table_row: Row,
) -> None:
    """The fake public host is opened; the metadata address, the node and a pod stay blocked."""
    table_row.expected = "the opened host only"
    assert network_control.reached[f"{PUBLIC_ADDRESS}:{LISTEN_PORT}"], network_control
    before = len(fake_hosts.connections())
    targets = [
        f"{PUBLIC_ADDRESS}:{LISTEN_PORT}",
        f"{METADATA_ADDRESS}:{LISTEN_PORT}",
        f"{node_ip}:10250",
        f"{network_control.peer_ip}:8080",
    ]
    create(
        custom_objects,
        hostile_namespace,
        "opened",
        language="python",
        source=TCP_PROBE,
        args=targets,
        network={
            "egress": "allowlist",
            "allow": [{"cidr": f"{PUBLIC_ADDRESS}/32", "ports": [{"port": LISTEN_PORT}]}],
        },
    )
    st: dict[str, Any] = status(wait_for(custom_objects, hostile_namespace, "opened"))
    lines = [" ".join(line.split()[:2]) for line in st.get("stdout", "").splitlines()]
    table_row.observed = ", ".join(lines)[:70]
    assert st["phase"] == "Succeeded", st
    assert lines == [f"open {targets[0]}"] + [f"blocked {target}" for target in targets[1:]]
    assert len(fake_hosts.connections()) == before + 1

"""The chart values the cluster suites install sandpod with: what a platform team sets on this
cluster (its real addresses, NetworkPolicies on), plus what some tests rely on."""

from __future__ import annotations

import os
from typing import Any

import yaml
from chart_release import merged
from kubernetes import client
from sandpod_testkit.kube import api_server_cidrs, cluster_ranges
from sandpod_testkit.paths import REPO_ROOT

# A RuntimeClass that the operator allows but the cluster lacks, and a language whose image
# does not exist: the operator's failure paths.
MISSING_RUNTIME_CLASS = "sandpod-missing-runtime"
MISSING_IMAGE_LANGUAGE = "missing-image"
MISSING_IMAGE = "localhost/sandpod/does-not-exist:0.0.0"
# The fake hosts of tests/hostile live in TEST-NET-3, which the egress rule public-only refuses:
# the release opens it, as an administrator opens a test network.
OPENED_TEST_NETWORK = "203.0.113.0/24"
# Requests small enough for several releases on the 2-core node (the operator keeps the
# chart's own: a node full of starting sandboxes must not starve it).
SMALL_REQUESTS: dict[str, Any] = {
    "gateway": {"resources": {"requests": {"cpu": "10m", "memory": "96Mi"}}},
    "egressProxy": {
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
        "monitorResources": {"requests": {"cpu": "5m", "memory": "16Mi"}},
        "binderResources": {"requests": {"cpu": "5m", "memory": "32Mi"}},
    },
}


def platform_values(api_client: client.ApiClient, node_ip: str) -> dict[str, Any]:
    """The settings a careful platform team turns on here: egress to the API server only
    (its real addresses), ingress from the node, the egress bounds naming the cluster's own
    ranges, the egress proxy; keys reloaded every second (tests add tenants); the CRD is the
    session's, so no `helm test` and no CRD of the release."""
    ranges = cluster_ranges(api_client)
    cidrs, ports = api_server_cidrs(api_client)
    platform = {
        "crds": {"enabled": False},
        "test": {"enabled": False},
        "networkPolicies": {
            "ingressFrom": [{"ipBlock": {"cidr": f"{node_ip}/32"}}],
            "apiServerEgress": {"enabled": True, "cidrs": cidrs, "ports": ports},
        },
        "egress": {
            "nodeCidrs": ranges["nodes"],
            "podCidrs": ranges["pods"],
            "serviceCidrs": ranges["services"],
            "apiServerCidrs": ranges["apiServer"],
            "openCidrs": [OPENED_TEST_NETWORK],
        },
        "egressProxy": {"enabled": True},
        "gateway": {"config": {"apiKeysRefreshSeconds": 1}},
    }
    return merged(merged(platform, SMALL_REQUESTS), platform_image_tags())


def platform_image_tags() -> dict[str, Any]:
    """$SANDPOD_TEST_PLATFORM_TAG: the tag of the operator and gateway images to test (images a
    branch built with SANDPOD_IMAGE_TAG), instead of the chart's default."""
    tag = os.environ.get("SANDPOD_TEST_PLATFORM_TAG")
    if not tag:
        return {}
    values: dict[str, Any] = {
        "operator": {"image": {"tag": tag}},
        "gateway": {"image": {"tag": tag}},
    }
    # $SANDPOD_TEST_SANDBOX_IMAGES (e.g. python,node,go): the catalog's languages of these
    # images take the images of the same tag (a branch that changed the runner built them).
    images = set(filter(None, os.environ.get("SANDPOD_TEST_SANDBOX_IMAGES", "").split(",")))
    if images:
        chart = yaml.safe_load((REPO_ROOT / "charts/sandpod/values.yaml").read_text())
        values["catalog"] = {
            "languages": {
                name: {"image": f"localhost/sandpod/{language['image']}:{tag}"}
                for name, language in chart["catalog"]["languages"].items()
                if language["image"] in images
            }
        }
    return values


def session_values(namespace_pattern: str) -> dict[str, Any]:
    """What the suites' own tests need besides: the namespaces they make, the failure paths
    above, memory limits above the node's."""
    return {
        "operator": {
            "watchNamespaces": [namespace_pattern],
            # A stalled operator (executions/stalls.py) is restarted within a minute, not after the
            # module's waits have all run out.
            "config": {
                "allowedRuntimeClasses": [MISSING_RUNTIME_CLASS],
                "maxMemory": "64Gi",
                "resyncAfterSeconds": 15,
                "stalledAfterSeconds": 30,
            },
        },
        "catalog": {
            "languages": {
                MISSING_IMAGE_LANGUAGE: {
                    "image": MISSING_IMAGE,
                    "file": "main.sh",
                    "command": ["sh", "main.sh"],
                }
            }
        },
    }


def narrowed_tenant(namespace: str, hosts: list[str]) -> dict[str, Any]:
    """A chart tenant whose allowlists may name only `hosts` (tenants[].egress)."""
    return {
        "name": namespace,
        "namespace": namespace,
        "createNamespace": False,
        "egress": {"allowedHosts": hosts},
    }

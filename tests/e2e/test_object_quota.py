"""The chart's object quota on the cluster: each tenant namespace gets a ResourceQuota
`sandpod-objects` (tenantNamespaces.objectQuota), and an execution created at once after the
install, with kubectl's API or through the gateway, is accepted. The API server refuses every
create a quota limits until the quota controller has counted it ("status unknown for
quota"), so an install is done once its quotas are counted: ChartRelease.install waits for
that (sandpod_testkit's wait_for_quotas), as `make run` does."""

from __future__ import annotations

import uuid
from typing import Any

from chart_release import installed, new_api_key
from cluster_fixtures import ReleaseFactory
from kubernetes import client
from sandpod_contract.models import TERMINAL_PHASES
from sandpod_contract.names import SESSION_PLURAL
from sandpod_contract.quantities import parse_quantity
from sandpod_testkit.kube import GROUP, PLURAL, VERSION
from sandpod_testkit.waiting import wait_until

OBJECT_COUNTS = {f"count/{PLURAL}.{GROUP}": "5000", f"count/{SESSION_PLURAL}.{GROUP}": "100"}
HELLO = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "CodeExecution",
    "metadata": {"name": "hello"},
    "spec": {"language": "python", "source": "print('hello')"},
}


def phase(objects: client.CustomObjectsApi, namespace: str, name: str) -> str | None:
    execution: Any = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    found = execution.get("status", {}).get("phase")
    return str(found) if found in TERMINAL_PHASES else None


def test_a_create_at_once_after_install_is_accepted(
    new_release: ReleaseFactory,
    namespace_prefix: str,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> None:
    prefix = f"{namespace_prefix}oq"
    tenant_namespace = f"{prefix}-team-{uuid.uuid4().hex[:4]}"
    key, digest = new_api_key()
    tenant = {"name": "team", "namespace": tenant_namespace, "apiKeys": [{"sha256": digest}]}

    with installed(new_release(prefix, {"tenants": [tenant]})) as release:
        # At once: a kubectl user's create, then the gateway's (once its Service answers).
        custom_objects.create_namespaced_custom_object(
            GROUP, VERSION, tenant_namespace, PLURAL, HELLO
        )
        gateway = release.gateway()
        gateway.wait_ready()
        with gateway.client(key) as http:
            through_gateway = http.post(
                "/v1/executions",
                params={"wait": "false"},
                json={"language": "python", "code": "print(2 + 2)"},
            )
        assert through_gateway.status_code == 202, through_gateway.text

        quota: Any = core_v1.read_namespaced_resource_quota("sandpod-objects", tenant_namespace)
        # The API server writes quantities its own way ("5000" is "5k").
        assert {name: parse_quantity(value) for name, value in quota.spec.hard.items()} == {
            name: parse_quantity(value) for name, value in OBJECT_COUNTS.items()
        }
        for name in ("hello", through_gateway.json()["id"]):
            finished = wait_until(
                lambda name=name: phase(custom_objects, tenant_namespace, name),
                timeout=180,
                what=f"{name} to finish",
            )
            assert finished == "Succeeded"
        wait_until(
            lambda: (
                core_v1.read_namespaced_resource_quota(
                    "sandpod-objects", tenant_namespace
                ).status.used.get(f"count/{PLURAL}.{GROUP}")
                == "2"
            ),
            timeout=60,
            what="the quota to count both executions",
        )

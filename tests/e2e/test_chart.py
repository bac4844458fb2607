"""The Helm chart on the cluster: install, `helm test`, upgrade, uninstall.

The release goes into the test's fresh namespace under a unique name. Its operator serves
only the release's own tenant namespace (named outside the test session's namespace prefix),
so it never meets the executions of other tests or of operators they run. The CRD is the
session's (crds.enabled=false): the chart must not take over, or delete, a CRD that other
tests use.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_release import helm_run
from kubernetes import client
from sandpod_testkit.kube import api_server_cidrs
from sandpod_testkit.paths import REPO_ROOT
from sandpod_testkit.quotas import wait_for_quotas
from sandpod_testkit.waiting import wait_until

CHART = REPO_ROOT / "charts" / "sandpod"
HELM_TIMEOUT = "5m"
TENANT = "e2e"


@dataclass
class Release:
    name: str
    namespace: str
    tenant_namespace: str
    api_key: str
    values_file: Path
    helm: Path
    kubeconfig: Path

    @property
    def fullname(self) -> str:
        return f"{self.name}-sandpod"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return helm_run(self.helm, self.kubeconfig, self.namespace, *args, timeout=600)

    def installed(self) -> bool:
        listed = self.run("list", "--filter", f"^{self.name}$", "--short")
        return bool(listed.stdout.strip())


@pytest.fixture
def release(
    namespace: str,
    sandpod_crd: str,
    helm: Path,
    kubeconfig_path: Path,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    tmp_path: Path,
) -> Iterator[Release]:
    """Values for a release in `namespace`; uninstalled afterwards if a test left it."""
    tenant_namespace = f"sandpod-chart-{uuid.uuid4().hex[:6]}"
    api_key = f"sk-{secrets.token_urlsafe(24)}"
    cidrs, ports = api_server_cidrs(api_client)
    values = {
        "crds": {"enabled": False},
        "tenants": [
            {
                "name": TENANT,
                "namespace": tenant_namespace,
                "apiKeys": [{"name": "helm-test", "key": api_key}],
                "limits": {"maxConcurrent": 2},
            }
        ],
        "operator": {"watchNamespaces": [tenant_namespace], "logLevel": "verbose"},
        # This cluster enforces NetworkPolicy: the components work with egress to the API
        # server only.
        "networkPolicies": {"apiServerEgress": {"enabled": True, "cidrs": cidrs, "ports": ports}},
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    installed = Release(
        name=f"sp{uuid.uuid4().hex[:6]}",
        namespace=namespace,
        tenant_namespace=tenant_namespace,
        api_key=api_key,
        values_file=values_file,
        helm=helm,
        kubeconfig=kubeconfig_path,
    )
    yield installed
    if installed.installed():
        installed.run("uninstall", installed.name, "--wait", "--timeout", HELM_TIMEOUT)
    if not namespace_gone(core_v1, tenant_namespace):
        core_v1.delete_namespace(tenant_namespace, propagation_policy="Background")


def deployment_rolled_out(apps: client.AppsV1Api, namespace: str, name: str) -> bool:
    deployment: Any = apps.read_namespaced_deployment(name, namespace)
    status = deployment.status
    wanted = deployment.spec.replicas
    return bool(
        status.observed_generation == deployment.metadata.generation
        and (status.updated_replicas or 0) == wanted
        and (status.ready_replicas or 0) == wanted
        and (status.replicas or 0) == wanted
    )


def allowed(
    api_client: client.ApiClient, account: str, namespace: str, verb: str, resource: str
) -> bool:
    """Whether a service account may do `verb` on `resource` (group/plural) in `namespace`."""
    group, _, plural = resource.rpartition("/")
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=account,
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb=verb, group=group, resource=plural
            ),
        )
    )
    result: Any = client.AuthorizationV1Api(api_client).create_subject_access_review(review)
    return bool(result.status.allowed)


def executions_of(custom_objects: client.CustomObjectsApi, namespace: str) -> list[dict[str, Any]]:
    listed: Any = custom_objects.list_namespaced_custom_object(
        "sandpod.dev", "v1alpha1", namespace, "codeexecutions"
    )
    return list(listed["items"])


def release_objects(api_client: client.ApiClient, release: Release) -> list[str]:
    """Every object of the release that should exist while it is installed."""
    selector = f"app.kubernetes.io/instance={release.name}"
    core = client.CoreV1Api(api_client)
    apps = client.AppsV1Api(api_client)
    rbac = client.RbacAuthorizationV1Api(api_client)
    networking = client.NetworkingV1Api(api_client)
    ns = release.namespace
    found: list[Any] = [
        *apps.list_namespaced_deployment(ns, label_selector=selector).items,
        *core.list_namespaced_service(ns, label_selector=selector).items,
        *core.list_namespaced_service_account(ns, label_selector=selector).items,
        *core.list_namespaced_secret(ns, label_selector=selector).items,
        *core.list_namespaced_config_map(ns, label_selector=selector).items,
        *core.list_namespaced_pod(ns, label_selector=selector).items,
        *rbac.list_role_binding_for_all_namespaces(label_selector=selector).items,
        *rbac.list_role_for_all_namespaces(label_selector=selector).items,
        *rbac.list_cluster_role(label_selector=selector).items,
        *rbac.list_cluster_role_binding(label_selector=selector).items,
        *networking.list_network_policy_for_all_namespaces(label_selector=selector).items,
        *core.list_namespace(label_selector=selector).items,
    ]
    return [f"{type(o).__name__} {o.metadata.namespace or ''}/{o.metadata.name}" for o in found]


def namespace_gone(core_v1: client.CoreV1Api, name: str) -> bool:
    try:
        core_v1.read_namespace(name)
    except client.ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def test_install_test_upgrade_uninstall(
    release: Release,
    sandpod_crd: str,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> None:
    apps = client.AppsV1Api(api_client)
    operator = f"{release.fullname}-operator"
    gateway = f"{release.fullname}-gateway"

    release.run(
        "install", release.name, str(CHART), "--values", str(release.values_file),
        "--wait", "--timeout", HELM_TIMEOUT,
    )  # fmt: skip
    wait_for_quotas(core_v1, release.tenant_namespace)
    for deployment in (operator, gateway):
        assert deployment_rolled_out(apps, release.namespace, deployment), deployment
    tenant_namespace: Any = core_v1.read_namespace(release.tenant_namespace)
    assert tenant_namespace.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"

    # Least privilege, as the API server's authorizer sees it.
    operator_account = f"system:serviceaccount:{release.namespace}:{operator}"
    gateway_account = f"system:serviceaccount:{release.namespace}:{gateway}"
    tenant, elsewhere = release.tenant_namespace, release.namespace
    assert allowed(api_client, operator_account, tenant, "create", "pods")
    assert not allowed(api_client, operator_account, elsewhere, "create", "pods")
    assert not allowed(api_client, operator_account, tenant, "get", "secrets")
    assert allowed(api_client, gateway_account, tenant, "create", "sandpod.dev/codeexecutions")
    assert not allowed(
        api_client, gateway_account, elsewhere, "create", "sandpod.dev/codeexecutions"
    )
    assert not allowed(api_client, gateway_account, tenant, "delete", "pods")
    assert not allowed(api_client, gateway_account, elsewhere, "list", "secrets")

    # helm test: one execution through the gateway's Service, from a pod in the cluster.
    tested = release.run("test", release.name, "--timeout", HELM_TIMEOUT)
    # Helm prints the test pod's log (its output-log policy) on stderr.
    assert "ok: execution" in tested.stderr, tested.stderr
    (execution,) = executions_of(custom_objects, release.tenant_namespace)
    assert execution["metadata"]["labels"]["sandpod.dev/tenant"] == TENANT
    assert execution["status"]["phase"] == "Succeeded"
    assert execution["status"]["stdout"] == "42\n"

    # Upgrade with a changed operator setting: the operator is replaced (Recreate), and the
    # whole path works again.
    operator_pods = (
        f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=operator"
    )
    before: Any = core_v1.list_namespaced_pod(release.namespace, label_selector=operator_pods)
    old_pods = {pod.metadata.name for pod in before.items}
    release.run(
        "upgrade", release.name, str(CHART), "--values", str(release.values_file),
        "--set", "operator.config.defaultTtlSeconds=600", "--wait", "--timeout", HELM_TIMEOUT,
    )  # fmt: skip
    wait_until(
        lambda: deployment_rolled_out(apps, release.namespace, operator),
        timeout=120,
        what="the upgraded operator",
    )
    after: Any = core_v1.list_namespaced_pod(release.namespace, label_selector=operator_pods)
    running = [pod for pod in after.items if pod.metadata.deletion_timestamp is None]
    assert len(running) == 1 and running[0].metadata.name not in old_pods
    env = {var.name: var.value for var in running[0].spec.containers[0].env}
    assert env["SANDPOD_DEFAULT_TTL_SECONDS"] == "600"
    status = json.loads(release.run("status", release.name, "--output", "json").stdout)
    assert status["version"] == 2
    release.run("test", release.name, "--timeout", HELM_TIMEOUT)
    assert len(executions_of(custom_objects, release.tenant_namespace)) == 2

    # Uninstall: the pre-delete hook releases the executions (which carry the operator's
    # finalizer), so the tenant namespace goes too; nothing of the release is left.
    assert all(
        "sandpod.dev/operator" in e["metadata"].get("finalizers", [])
        for e in executions_of(custom_objects, release.tenant_namespace)
    )
    uninstalled = release.run("uninstall", release.name, "--wait", "--timeout", HELM_TIMEOUT)
    assert "released 2 execution(s) and pool(s) from sandpod.dev/operator" in uninstalled.stderr, (
        uninstalled.stderr
    )
    assert not release.installed()
    wait_until(
        lambda: namespace_gone(core_v1, release.tenant_namespace),
        timeout=180,
        what=f"tenant namespace {release.tenant_namespace} to be deleted",
    )
    wait_until(
        lambda: not release_objects(api_client, release),
        timeout=120,
        what="every object of the release to be deleted",
    )
    # The CRD was not the release's: it stays.
    client.ApiextensionsV1Api(api_client).read_custom_resource_definition(sandpod_crd)


def generated_test_key(core_v1: client.CoreV1Api, release: Release) -> tuple[str, dict[str, str]]:
    """The key the chart generated for `helm test`, and the digests of the test tenant's keys
    in the gateway's keys Secret (by key name)."""
    secret: Any = core_v1.read_namespaced_secret(
        f"{release.fullname}-test-api-key", release.namespace
    )
    assert secret.metadata.annotations["sandpod.dev/chart-generated"] == "true"
    key = base64.b64decode(secret.data["api-key"]).decode()
    keys: Any = core_v1.read_namespaced_secret(f"{release.fullname}-api-keys", release.namespace)
    text = base64.b64decode(keys.data["tenants.yaml"]).decode()
    assert key not in text
    tenant = yaml.safe_load(text)["tenants"][TENANT]
    return key, {entry["name"]: entry["sha256"] for entry in tenant["apiKeys"]}


def test_helm_test_with_hashed_keys_only(
    release: Release, core_v1: client.CoreV1Api, custom_objects: client.CustomObjectsApi
) -> None:
    """A platform team's install: the tenant's keys are digests only. `helm test` runs with a
    key the chart generates, which an upgrade keeps and deleting its Secret renews."""
    values = yaml.safe_load(release.values_file.read_text())
    tenant_digest = hashlib.sha256(release.api_key.encode()).hexdigest()
    values["tenants"][0]["apiKeys"] = [{"name": "ci", "sha256": tenant_digest}]
    # A new key reaches the gateway within this (the test waits for it): short, to keep it quick.
    values["gateway"] = {"config": {"apiKeysRefreshSeconds": 5}}
    release.values_file.write_text(yaml.safe_dump(values))
    assert release.api_key not in release.values_file.read_text()
    deploy = ["--values", str(release.values_file), "--wait", "--timeout", HELM_TIMEOUT]

    def helm_test_passes() -> None:
        tested = release.run("test", release.name, "--timeout", HELM_TIMEOUT)
        assert "ok: execution" in tested.stderr, tested.stderr

    release.run("install", release.name, str(CHART), *deploy)
    wait_for_quotas(core_v1, release.tenant_namespace)
    key, digests = generated_test_key(core_v1, release)
    assert digests == {"ci": tenant_digest, "helm-test": hashlib.sha256(key.encode()).hexdigest()}
    helm_test_passes()
    (execution,) = executions_of(custom_objects, release.tenant_namespace)
    assert execution["metadata"]["labels"]["sandpod.dev/tenant"] == TENANT

    # An upgrade finds the key (Helm's `lookup`) and keeps it.
    release.run("upgrade", release.name, str(CHART), *deploy)
    assert generated_test_key(core_v1, release) == (key, digests)
    helm_test_passes()

    # Without its Secret, the next upgrade makes a new key; the test waits until the gateway
    # has loaded it (as after an upgrade from a chart without one).
    core_v1.delete_namespaced_secret(f"{release.fullname}-test-api-key", release.namespace)
    release.run("upgrade", release.name, str(CHART), *deploy)
    renewed, renewed_digests = generated_test_key(core_v1, release)
    assert renewed != key
    assert renewed_digests == {
        "ci": tenant_digest,
        "helm-test": hashlib.sha256(renewed.encode()).hexdigest(),
    }
    helm_test_passes()
    assert len(executions_of(custom_objects, release.tenant_namespace)) == 3

"""The quota controller and a CRD applied just before a quota that counts it: the CI failure of
a fresh cluster's `make run` ("status unknown for quota" on the first `kubectl apply` after
the install), reproduced on a private etcd + kube-apiserver + kube-controller-manager (the
resource quota controller alone), and what `make run` and the cluster suites do about it
(sandpod_testkit.quotas.wait_for_quotas)."""

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from sandpod_contract.names import GROUP, PLURAL, VERSION
from sandpod_testkit.apiserver import PrivateApiServer, require_kube_bin_dir
from sandpod_testkit.paths import CRD_PATH
from sandpod_testkit.quotas import uncounted, wait_for_quotas
from sandpod_testkit.waiting import wait_until

COUNTED = f"count/{PLURAL}.{GROUP}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateApiServer]:
    """An API server without the CRD yet, and the resource quota controller."""
    server = PrivateApiServer(require_kube_bin_dir(), tmp_path_factory.mktemp("quota"))
    try:
        server.start()
        server.start_controllers("resourcequota")
        yield server
    finally:
        server.stop()


def execution(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CodeExecution",
        "metadata": {"name": name},
        "spec": {"language": "python", "source": "print(1)"},
    }


def quota_manifest(namespace: str, name: str, hard: dict[str, str], **metadata: Any) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace, **metadata},
        "spec": {"hard": hard},
    }


def test_a_quota_made_with_its_crd_is_counted_after_the_wait(cluster: PrivateApiServer) -> None:
    namespace = f"q-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster.kubeconfig)
    )
    core = client.CoreV1Api(api)
    # The controller is running (its first discovery done, the next one 30 s away) once it
    # counts a quota of a built-in kind.
    cluster.apply(quota_manifest(namespace, "probe", {"count/configmaps": "10"}))
    wait_for_quotas(core, namespace, timeout=60)
    # The order of a fresh `make run`: the CRD, then at once the chart's quota.
    cluster.kubectl("apply", "-f", str(CRD_PATH))
    labels = {"app.kubernetes.io/managed-by": "Helm"}
    annotations = {"meta.helm.sh/release-name": "sandpod"}
    cluster.apply(
        quota_manifest(
            namespace,
            "sandpod-objects",
            {COUNTED: "5"},
            labels=labels,
            annotations=annotations,
        )
    )

    def quota() -> Any:
        return api.sanitize_for_serialization(
            core.read_namespaced_resource_quota("sandpod-objects", namespace)
        )

    # The controller syncs it before it has found the CRD: hard limits, no usage of them.
    wait_until(lambda: (quota().get("status") or {}).get("hard"), timeout=60, what="a sync")
    refused = cluster.kubectl_run(
        "create", "-n", namespace, "-f", "-", stdin=json.dumps(execution("first"))
    )
    started = time.monotonic()
    wait_for_quotas(core, namespace)
    waited = time.monotonic() - started
    created = cluster.kubectl_run(
        "create", "-n", namespace, "-f", "-", stdin=json.dumps(execution("second"))
    )

    print(f"\nthe quota counted {COUNTED} after {waited:.0f} s of waiting")
    assert "status unknown for quota: sandpod-objects" in refused.stderr, refused.stderr
    assert created.returncode == 0, created.stderr
    counted = quota()
    assert uncounted(counted) == []
    assert counted["status"]["used"][COUNTED] == "1"
    # Re-created as it was: still the release's.
    assert counted["metadata"]["labels"] == labels
    assert annotations.items() <= counted["metadata"]["annotations"].items()

"""The gateway's Kubernetes side against a real, private etcd + kube-apiserver.

No scheduler, kubelet or operator: the test plays the operator by writing statuses, and
pods never start. Skipped when the local cluster's Kubernetes build is not on this machine.
"""

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
import yaml
from fastapi import FastAPI
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi
from sandpod_contract.kube import open_api_client
from sandpod_contract.names import CANCEL_ANNOTATION, GROUP, PLURAL, TENANT_LABEL, VERSION
from sandpod_contract.runner import OutputChunk
from sandpod_gateway.kube.kube_service import KubernetesExecutionService
from sandpod_gateway.kube.service import (
    ExecutionAlreadyExists,
    ExecutionNotFound,
    InvalidCursor,
    QuotaExceeded,
    QuotaNotCounted,
)
from sandpod_gateway.main import create_app
from sandpod_gateway.policy.auth import KeyStoreUnavailable, SecretApiKeyStore, hash_api_key
from sandpod_gateway.settings import GatewaySettings
from sandpod_testkit.apiserver import PrivateApiServer, require_kube_bin_dir
from sandpod_testkit.paths import CRD_PATH


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateApiServer]:
    server = PrivateApiServer(require_kube_bin_dir(), tmp_path_factory.mktemp("apiserver"))
    try:
        server.start()
        server.kubectl("apply", "-f", str(CRD_PATH))
        server.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{PLURAL}.{GROUP}"
        )
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace(api_server: PrivateApiServer) -> str:
    name = f"gw-{uuid.uuid4().hex[:8]}"
    api_server.kubectl("create", "namespace", name)
    return name


@asynccontextmanager
async def kube(api_server: PrivateApiServer) -> AsyncIterator[ApiClient]:
    client = await open_api_client(api_server.kubeconfig)
    async with client:
        yield client


async def created(client: ApiClient, namespace: str, name: str) -> KubernetesExecutionService:
    """The gateway's execution service, once it has created the execution `name`."""
    service = KubernetesExecutionService(client)
    await service.create(namespace, manifest(name))
    return service


async def collected(chunks: AsyncIterator[OutputChunk]) -> list[OutputChunk]:
    return [chunk async for chunk in chunks]


def manifest(name: str, tenant: str = "t1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CodeExecution",
        "metadata": {"name": name, "labels": {TENANT_LABEL: tenant}},
        "spec": {"language": "python", "source": "print(1)", **spec},
    }


async def set_status(client: ApiClient, namespace: str, name: str, **status: Any) -> None:
    await CustomObjectsApi(client).patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        {"status": status},
        _content_type="application/merge-patch+json",
    )


# --- the execution service --------------------------------------------------------------


async def test_create_get_list_and_cancel(api_server: PrivateApiServer, namespace: str) -> None:
    async with kube(api_server) as client:
        service = KubernetesExecutionService(client)
        for index in range(3):
            await service.create(namespace, manifest(f"cx-{index}"))
        await service.create(namespace, manifest("cx-other", tenant="t2"))

        with pytest.raises(ExecutionAlreadyExists):
            await service.create(namespace, manifest("cx-0"))
        assert (await service.get(namespace, "cx-1"))["spec"]["source"] == "print(1)"
        with pytest.raises(ExecutionNotFound):
            await service.get(namespace, "cx-nope")
        first = await service.list(
            namespace, label_selector=f"{TENANT_LABEL}=t1", limit=2, cursor=None
        )
        rest = await service.list(
            namespace, label_selector=f"{TENANT_LABEL}=t1", limit=2, cursor=first.next_cursor
        )
        everything = await service.list(
            namespace, label_selector=f"{TENANT_LABEL}=t1", limit=None, cursor=None
        )
        with pytest.raises(InvalidCursor):
            await service.list(namespace, label_selector="a=b", limit=2, cursor="garbage")
        cancelled = await service.cancel(namespace, "cx-2")
        with pytest.raises(ExecutionNotFound):
            await service.cancel(namespace, "cx-nope")
        await service.check_ready()

    names = [item["metadata"]["name"] for item in first.items + rest.items]
    assert names == ["cx-0", "cx-1", "cx-2"]
    assert rest.next_cursor is None
    assert len(everything.items) == 3
    assert cancelled["metadata"]["annotations"][CANCEL_ANNOTATION] == "true"


async def test_quota_refusals_are_told_apart(api_server: PrivateApiServer, namespace: str) -> None:
    """This API server runs no quota controller: the test writes the quota's status as the
    controller does, first its hard limits without their usage (as after a sync before the
    controller has found the CRD: every create refused, "status unknown for quota"), then
    the usage; then the quota's own limit refuses the second execution."""
    counted = f"count/{PLURAL}.{GROUP}"
    api_server.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "tiny", "namespace": namespace},
            "spec": {"hard": {counted: "1"}},
        }
    )
    async with kube(api_server) as client:
        core, service = CoreV1Api(client), KubernetesExecutionService(client)
        await core.patch_namespaced_resource_quota_status(
            "tiny", namespace, {"status": {"hard": {counted: "1"}}}
        )
        with pytest.raises(QuotaNotCounted) as not_counted:
            await service.create(namespace, manifest("first"))
        await core.patch_namespaced_resource_quota_status(
            "tiny", namespace, {"status": {"used": {counted: "0"}}}
        )
        await service.create(namespace, manifest("first"))
        with pytest.raises(QuotaExceeded) as exceeded:
            await service.create(namespace, manifest("second"))

    assert not_counted.value.quota == "tiny"
    assert (exceeded.value.quota, exceeded.value.limited) == ("tiny", f"{counted}=1")


async def test_wait_follows_the_status_to_the_end(
    api_server: PrivateApiServer, namespace: str
) -> None:
    async with kube(api_server) as client:
        service = await created(client, namespace, "cx-wait")
        waiting = asyncio.create_task(service.wait(namespace, "cx-wait", timeout=60))
        await set_status(client, namespace, "cx-wait", phase="Running")
        await set_status(client, namespace, "cx-wait", phase="Succeeded", exitCode=0, stdout="1\n")

        finished = await waiting

    assert finished["status"]["phase"] == "Succeeded"
    assert finished["status"]["stdout"] == "1\n"


async def test_wait_gives_up_at_its_deadline_with_the_current_state(
    api_server: PrivateApiServer, namespace: str
) -> None:
    async with kube(api_server) as client:
        service = await created(client, namespace, "cx-slow")
        await set_status(client, namespace, "cx-slow", phase="Running")

        started = time.monotonic()
        # It gives up: a wait past its deadline would end at the outer one, failing the test.
        current = await asyncio.wait_for(service.wait(namespace, "cx-slow", timeout=2), 120)
        waited = time.monotonic() - started

    assert current["status"]["phase"] == "Running"
    assert waited >= 1.5


async def test_wait_reports_a_deleted_execution(
    api_server: PrivateApiServer, namespace: str
) -> None:
    async with kube(api_server) as client:
        service = await created(client, namespace, "cx-gone")
        waiting = asyncio.create_task(service.wait(namespace, "cx-gone", timeout=60))
        await CustomObjectsApi(client).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "cx-gone"
        )

        with pytest.raises(ExecutionNotFound):
            await waiting


async def test_stream_of_a_pod_that_never_starts_ends_empty(
    api_server: PrivateApiServer, namespace: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sandbox"},
        "spec": {  # never scheduled: there is no scheduler
            "automountServiceAccountToken": False,
            "containers": [{"name": "runner", "image": "none"}],
        },
    }
    api_server.kubectl("create", "serviceaccount", "default", "-n", namespace)
    async with kube(api_server) as client:
        await CoreV1Api(client).create_namespaced_pod(namespace, pod)
        service = await created(client, namespace, "cx-stream")
        await set_status(client, namespace, "cx-stream", phase="Pending", podName="sandbox")

        started = time.monotonic()
        chunks = await asyncio.wait_for(collected(service.stream(namespace, "cx-stream", 2)), 120)
        waited = time.monotonic() - started
        await set_status(client, namespace, "cx-stream", phase="Error", podName="gone")
        after_the_end = [
            chunk async for chunk in service.stream(namespace, "cx-stream", timeout=60)
        ]

    assert chunks == []
    assert waited >= 1.5  # it waited for the pod to start, until its deadline
    assert after_the_end == []


# --- API keys from the Secret -----------------------------------------------------------


async def test_keys_come_from_the_secret_and_follow_its_changes(
    api_server: PrivateApiServer, namespace: str
) -> None:
    def tenants_yaml(key: str) -> str:
        return yaml.safe_dump({"tenants": {"team": {"apiKeys": [{"sha256": hash_api_key(key)}]}}})

    async with kube(api_server) as client:
        store = SecretApiKeyStore(client, namespace, "keys", refresh_seconds=0.2)
        with pytest.raises(KeyStoreUnavailable):
            await store.authenticate("sk-1")
        secret = {
            "metadata": {"name": "keys"},
            "data": {"tenants.yaml": base64.b64encode(tenants_yaml("sk-1").encode()).decode()},
        }
        await CoreV1Api(client).create_namespaced_secret(namespace, secret)
        tenant = await store.authenticate("sk-1")  # no keys yet: it reads the Secret again
        await CoreV1Api(client).patch_namespaced_secret(
            "keys", namespace, {"stringData": {"tenants.yaml": tenants_yaml("sk-2")}}
        )
        deadline = time.monotonic() + 10
        while await store.authenticate("sk-2") is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        rotated = await store.authenticate("sk-2"), await store.authenticate("sk-1")

    assert tenant is not None
    assert (tenant.name, tenant.namespace) == ("team", "team")
    assert rotated[0] is not None
    assert rotated[1] is None


# --- the whole app, with the test as the operator ---------------------------------------


async def test_post_waits_for_the_status_the_operator_writes(
    api_server: PrivateApiServer, namespace: str
) -> None:
    key = "sk-app-0123456789"
    api_server.kubectl(
        "create",
        "secret",
        "generic",
        "sandpod-api-keys",
        "-n",
        namespace,
        "--from-literal=tenants.yaml="
        + yaml.safe_dump(
            {
                "tenants": {
                    "team": {"namespace": namespace, "apiKeys": [{"sha256": hash_api_key(key)}]}
                }
            }
        ),
    )
    app: FastAPI = create_app(
        GatewaySettings(kubeconfig=api_server.kubeconfig, api_keys_namespace=namespace)
    )
    async with (
        kube(api_server) as client,
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://gateway",
            headers={"Authorization": f"Bearer {key}"},
        ) as http,
    ):
        assert (await http.get("/readyz")).status_code == 200
        posting = asyncio.create_task(
            http.post("/v1/executions", json={"language": "python", "code": "print(7)"})
        )
        objects = CustomObjectsApi(client)
        deadline = time.monotonic() + 30
        while not (
            items := (
                await objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
            )["items"]
        ):
            assert time.monotonic() < deadline, "the gateway created no CodeExecution"
            await asyncio.sleep(0.1)
        name = items[0]["metadata"]["name"]
        await set_status(
            client, namespace, name, phase="Succeeded", exitCode=0, stdout="7\n", durationMs=12
        )
        response = await posting
        cancel = await http.delete(f"/v1/executions/{name}")

    assert response.status_code == 200, response.text
    result = response.json()
    assert (result["id"], result["status"], result["stdout"]) == (name, "success", "7\n")
    assert result["execution_time_ms"] == 12
    assert items[0]["metadata"]["labels"][TENANT_LABEL] == "team"
    assert cancel.status_code == 200  # finished already: nothing to cancel

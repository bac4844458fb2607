"""The labels the gateway counts a tenant's running executions by, against a real, private
etcd + kube-apiserver: the operator's finished label (written to this very execution only)
and the gateway's metadata-only list of the unfinished ones. The API server and helpers are
those of test_gateway_kube_service.py."""

from kubernetes_asyncio.client import CustomObjectsApi
from sandpod_contract.names import FINISHED_LABEL, GROUP, PLURAL, TENANT_LABEL, VERSION
from sandpod_gateway.kube.kube_service import KubernetesExecutionService
from sandpod_gateway.policy.admission import unfinished_selector
from sandpod_operator.kube import Kube, RequestCounter
from test_gateway_kube_service import PrivateApiServer, api_server, kube, manifest, namespace

# The API server and a fresh namespace per test, as fixtures of this module too.
__all__ = ["api_server", "namespace"]


async def test_unfinished_executions_are_listed_as_metadata_only(
    api_server: PrivateApiServer, namespace: str
) -> None:
    async with kube(api_server) as client:
        service = KubernetesExecutionService(client)
        for index in range(4):
            await service.create(namespace, manifest(f"cx-{index}", source="x" * 10_000))
        await service.create(namespace, manifest("cx-other", tenant="t2"))
        labelled = {"metadata": {"labels": {FINISHED_LABEL: "true"}}}
        await CustomObjectsApi(client).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "cx-1", labelled,
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        selector = unfinished_selector("t1")
        unfinished = await service.list_metadata(namespace, label_selector=selector, limit=10)
        limited = await service.list_metadata(namespace, label_selector=selector, limit=2)

    assert [item["metadata"]["name"] for item in unfinished] == ["cx-0", "cx-2", "cx-3"]
    for item in unfinished:
        assert item["kind"] == "PartialObjectMetadata"
        assert "spec" not in item
    assert "creationTimestamp" in unfinished[0]["metadata"]
    assert len(limited) == 2


async def test_the_operator_labels_this_very_execution_finished(
    api_server: PrivateApiServer, namespace: str
) -> None:
    async with kube(api_server) as client:
        objects = CustomObjectsApi(client)
        operator_kube = Kube(client, RequestCounter())
        first = await objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, manifest("cx-done")
        )
        await operator_kube.label_finished(namespace, "cx-done", uid=first["metadata"]["uid"])
        await operator_kube.label_finished(namespace, "cx-gone", uid="no-such-uid")
        # A re-created namesake is not the execution that finished.
        await objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "cx-done")
        await objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, manifest("cx-done")
        )
        await operator_kube.label_finished(namespace, "cx-done", uid=first["metadata"]["uid"])
        namesake = await objects.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "cx-done"
        )

    assert FINISHED_LABEL not in namesake["metadata"]["labels"]


async def test_a_labelled_execution_keeps_its_other_labels(
    api_server: PrivateApiServer, namespace: str
) -> None:
    async with kube(api_server) as client:
        objects = CustomObjectsApi(client)
        created = await objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, manifest("cx-labels")
        )
        await Kube(client, RequestCounter()).label_finished(
            namespace, "cx-labels", uid=created["metadata"]["uid"]
        )
        labelled = await objects.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "cx-labels"
        )

    assert labelled["metadata"]["labels"] == {TENANT_LABEL: "t1", FINISHED_LABEL: "true"}

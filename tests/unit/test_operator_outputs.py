"""Output files: the Reconciler stores the verified files of a run in the execution's
ConfigMap `<child>-outputs` and lists them in status (in-memory API server, no cluster)."""

import base64
from datetime import timedelta

import pytest
import runner_wire
from fake_kube import FakeKube, Key, terminated_status
from runner_wire import file_frames, listing
from sandpod_contract.catalog import load_catalog
from sandpod_contract.names import child_name
from sandpod_operator.executions.reconciler import Reconciler
from sandpod_operator.settings import OperatorSettings
from test_operator_reconciler import (
    NAMESPACE,
    ago,
    image_of,
    kubelet_runs,
    latest,
    namesake,
    outcome,
    started,
    status_of,
)

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
CSV = b"a,b\n1,2\n"
BIG = b"x" * 3000


@pytest.fixture
def reconciler(kube: FakeKube) -> Reconciler:
    settings = OperatorSettings(outputs_stored_bytes=2500)
    return Reconciler(
        kube=kube, settings=settings, catalog=load_catalog(), post_event=kube.post_event
    )


def runner_leaves_files(kube: FakeKube, key: Key, files: dict[str, bytes], listed: list) -> None:
    """The runner framed `files` and listed `listed` in its summary; the pod ended."""
    frames = [frame for path, content in files.items() for frame in file_frames(path, content)]
    result = runner_wire.result(outputs=listed, outputsTruncated=False, outputsSkipped=0)
    message = runner_wire.termination_message(result, len(frames))
    finished = ago(1)
    status = terminated_status(
        finished - timedelta(seconds=1), finished, message, image=image_of(kube, key)
    )
    kube.logs[key] = runner_wire.pod_log(frames, result)
    kube.set_pod_status(*key, status)


async def finish_with_files(
    kube: FakeKube, reconciler: Reconciler, files: dict[str, bytes], listed: list
) -> None:
    key = await started(kube, reconciler)
    kubelet_runs(kube, key, ago(2))
    runner_leaves_files(kube, key, files, listed)
    await reconciler.on_pod_event("MODIFIED", kube.pods[key])


async def test_verified_files_are_stored_within_the_limit_and_listed(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    files = {"plot.png": PNG, "big.bin": BIG, "t.csv": CSV, "forged.txt": b"other bytes"}
    listed = [
        listing("plot.png", PNG, "image/png"),
        listing("big.bin", BIG),
        listing("t.csv", CSV, "text/csv"),
        listing("forged.txt", b"what the runner saw"),
    ]
    await finish_with_files(kube, reconciler, files, listed)

    status = status_of(kube)
    assert outcome(kube) == ("Succeeded", "Completed")
    assert [(o["path"], o["stored"], o.get("key")) for o in status["outputs"]] == [
        ("plot.png", True, "file-0"),
        ("big.bin", False, None),
        ("t.csv", True, "file-1"),
    ]
    assert status["outputs"][0]["mediaType"] == "image/png"
    assert status["outputsTruncated"] is True  # forged.txt did not verify
    execution = latest(kube)
    name = child_name("hello", execution["metadata"]["uid"]) + "-outputs"
    assert status["outputsConfigMap"] == name
    configmap = kube.configmaps[(NAMESPACE, name)]
    assert configmap["binaryData"] == {
        "file-0": base64.b64encode(PNG).decode(),
        "file-1": base64.b64encode(CSV).decode(),
    }
    assert configmap["metadata"]["ownerReferences"][0]["uid"] == execution["metadata"]["uid"]


async def test_a_run_without_files_creates_no_outputs_configmap(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    await finish_with_files(kube, reconciler, {}, [])
    assert outcome(kube) == ("Succeeded", "Completed")
    assert "outputs" not in status_of(kube)
    assert len(kube.configmaps) == 1  # the input ConfigMap only


async def test_a_namesake_outputs_configmap_ends_the_execution_and_is_left_alone(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    key = await started(kube, reconciler)
    uid = latest(kube)["metadata"]["uid"]
    name = child_name("hello", uid) + "-outputs"
    planted = kube.add_foreign(kube.configmaps, namesake("ConfigMap", name))
    kubelet_runs(kube, key, ago(2))
    runner_leaves_files(kube, key, {"t.csv": CSV}, [listing("t.csv", CSV)])

    await reconciler.on_pod_event("MODIFIED", kube.pods[key])

    assert outcome(kube, "retryable") == ("Error", "ChildConflict", False)
    assert "output files were not stored" in status_of(kube)["message"]
    assert kube.configmaps[(NAMESPACE, name)]["metadata"] == planted["metadata"]
    assert "binaryData" not in kube.configmaps[(NAMESPACE, name)]


async def test_storing_again_after_a_restart_finds_its_own_configmap(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    execution_files = {"t.csv": CSV}
    key = await started(kube, reconciler)
    kubelet_runs(kube, key, ago(2))
    runner_leaves_files(kube, key, execution_files, [listing("t.csv", CSV)])
    verdict = await reconciler.judge(latest(kube), kube.pods[key])
    first = await reconciler.store_outputs(latest(kube), verdict)
    again = await reconciler.store_outputs(latest(kube), verdict)
    assert first.outputs == again.outputs and first.outputs is not None
    assert sum(1 for kind, _ in kube.created if kind == "ConfigMap") == 2  # input, outputs

"""File names a person can trust (docs/runner-protocol.md, "File names"): a program that
leaves files whose names would read as other names (`report\\u202etxt.exe` shows as
`reportexe.txt`; a zero-width space hides in a name) gets back only its clean file, in the
gateway's answer and in the CodeExecution's status alike; an upload under such a name is
refused with a 422 naming the character, and nothing runs.

Needs the runner, operator and gateway images built from this tree (the runner skips such
names; the gateway refuses them by name).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from chart_release import DeployedGateway
from executions import GROUP, PLURAL, RECORD_TIMEOUT, VERSION, status, wait_for
from kubernetes import client
from results_table import Row

pytestmark = pytest.mark.usefixtures("sandpod_operator")

FORGED = ("report\u202etxt.exe", "pass\u200bword.txt", "a\u2066b\u2069.csv", "bell\u0007.txt")
# The program writes the forged names and a clean one, and lists what it wrote.
WRITE_OUTPUTS = f"""import os
out = os.environ["SANDPOD_OUTPUTS"]
for name in {[*FORGED, "clean.txt"]!r}:
    with open(os.path.join(out, name), "w") as file:
        file.write("x")
print(len(os.listdir(out)))
"""


@pytest.fixture
def tenant(gateway: DeployedGateway, hostile_namespace: str) -> Iterator[httpx.Client]:
    key = gateway.add_tenant(hostile_namespace, hostile_namespace, maxSessions=1)
    with gateway.client(key) as http:
        yield http


def recorded_outputs(objects: client.CustomObjectsApi, namespace: str, name: str) -> list[str]:
    """The output files its record lists, once written (a session run's: behind its answer)."""
    execution = wait_for(objects, namespace, name, timeout=RECORD_TIMEOUT)
    return [entry["path"] for entry in status(execution).get("outputs") or []]


def test_output_files_whose_names_could_read_as_others_do_not_come_back(
    tenant: httpx.Client,
    hostile_namespace: str,
    custom_objects: client.CustomObjectsApi,
    table_row: Row,
) -> None:
    table_row.expected = "program wrote 5 files; result and record list only clean.txt"

    response = tenant.post("/v1/executions", json={"language": "python", "code": WRITE_OUTPUTS})

    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    answered = [file["path"] for file in result["files"]]
    recorded = recorded_outputs(custom_objects, hostile_namespace, result["id"])
    table_row.observed = f"wrote {result['stdout'].strip()}; answer {answered}, record {recorded}"
    assert (result["status"], result["stdout"]) == ("success", f"{len(FORGED) + 1}\n"), result
    assert answered == recorded == ["clean.txt"]


def test_an_upload_under_such_a_name_is_refused_naming_the_character(
    tenant: httpx.Client,
    hostile_namespace: str,
    custom_objects: client.CustomObjectsApi,
    table_row: Row,
) -> None:
    table_row.expected = "422 naming U+202E, nothing run; a session run's outputs: clean.txt"
    opened = tenant.post("/v1/sessions", json={"language": "python"})
    assert opened.status_code == 201, opened.text
    session = opened.json()["id"]
    try:
        run = tenant.post(f"/v1/sessions/{session}/executions", json={"code": WRITE_OUTPUTS})
        upload = tenant.put(f"/v1/sessions/{session}/files/{FORGED[0]}", content=b"MZ")
    finally:
        tenant.delete(f"/v1/sessions/{session}")

    details = upload.json()["error"].get("details") or [{}]
    table_row.observed = f"{upload.status_code} {details[0].get('message', '')[:40]!r}"
    assert run.status_code == 200, run.text
    assert [file["path"] for file in run.json()["files"]] == ["clean.txt"]
    assert recorded_outputs(custom_objects, hostile_namespace, run.json()["id"]) == ["clean.txt"]
    assert upload.status_code == 422, upload.text
    assert (details[0]["field"], details[0]["type"]) == ("path.path", "file_name")
    assert details[0]["message"].startswith("U+202E RIGHT-TO-LEFT OVERRIDE")
    executions: Any = custom_objects.list_namespaced_custom_object(
        GROUP, VERSION, hostile_namespace, PLURAL
    )
    assert [item["metadata"]["name"] for item in executions["items"]] == [run.json()["id"]]

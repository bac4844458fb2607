"""Sessions through the gateway, end to end: a uvicorn process against the cluster, with the
operator running (the session's `gateway` fixture, cluster_fixtures.py). They need the
operator's CodeSession controller and the runner's session mode (notes/sessions.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from chart_release import REQUEST_TIMEOUT, ChartRelease, DeployedGateway
from executions import RECORD_TIMEOUT, wait_for
from kube_helpers import pod_finished, wait_for_pod
from kubernetes import client
from sandpod_contract.catalog import load_catalog
from sandpod_contract.names import RECORD_DIRECT, RECORD_LABEL
from sandpod_testkit.kube import GROUP, PLURAL, VERSION
from sandpod_testkit.sessions import open_session, run_in
from sandpod_testkit.sse import iter_sse
from sandpod_testkit.waiting import wait_until


@pytest.fixture
def alice(gateway: DeployedGateway, namespace: str) -> Iterator[httpx.Client]:
    key = gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=60, maxSessions=2)
    with gateway.client(key) as http:
        yield http


@pytest.fixture
def session(alice: httpx.Client) -> Iterator[str]:
    """An open Python session of alice's, closed afterwards."""
    session_id = open_session(alice)
    yield session_id
    alice.delete(f"/v1/sessions/{session_id}")


def test_two_runs_share_a_variable(alice: httpx.Client, session: str) -> None:
    first = run_in(alice, session, "x = 41\nprint('set')")
    second = run_in(alice, session, "print(x + 1)\nx + 1")

    assert (first["status"], first["stdout"]) == ("success", "set\n")
    assert (second["status"], second["stdout"], second["result"]) == ("success", "42\n", "42")
    assert second["session"] == session
    assert second["state_lost"] is False
    assert second["reported_by"] == "sessionKernel"
    # Counted behind the answers (one session status write for runs close together).
    wait_until(
        lambda: alice.get(f"/v1/sessions/{session}").json()["execution_count"] == 2,
        timeout=RECORD_TIMEOUT,
        what="the session to count both runs",
    )
    assert alice.get(f"/v1/sessions/{session}").json()["status"] == "ready"


def test_a_run_streamed_from_a_session_sends_each_line_as_it_is_written(
    alice: httpx.Client, session: str
) -> None:
    run_in(alice, session, "import time")  # the session is ready: the direct path takes the run
    program = "print('first', flush=True)\ntime.sleep(3)\nprint('second')\n"
    arrivals = []
    with alice.stream(
        "POST", f"/v1/sessions/{session}/executions/stream", json={"code": program}
    ) as response:
        assert response.status_code == 200
        for event, data in iter_sse(response.iter_lines()):
            arrivals.append((time.monotonic(), event, data))

    assert [event for _, event, _ in arrivals] == ["stdout", "stdout", "exit"]
    (first_at, _, first), (second_at, _, second), (_, _, result) = arrivals
    assert (first["data"], second["data"]) == ("first\n", "second\n")
    assert (result["status"], result["stdout"], result["session"]) == (
        "success",
        "first\nsecond\n",
        session,
    )
    # "first" came while the program still slept before "second".
    assert second_at - first_at >= 1.0


def test_a_shell_command_runs_beside_the_sessions_interpreter(
    alice: httpx.Client, session: str
) -> None:
    run_in(
        alice,
        session,
        "import os\nos.makedirs('sub')\nopen('sub/made.txt', 'w').write('by python')",
    )
    done = alice.post(
        f"/v1/sessions/{session}/commands",
        json={
            "command": 'cat made.txt; echo "$WHO" >&2; exit 3',
            "env": {"WHO": "bash"},
            "cwd": "sub",
        },
    )

    assert done.status_code == 200, done.text
    result = done.json()
    assert (result["status"], result["exit_code"], result["stdout"], result["stderr"]) == (
        "error",
        3,
        "by python",
        "bash\n",
    )
    assert result["session"] == session
    assert run_in(alice, session, "os.getcwd()")["result"] == "'/tmp/work'"


def test_another_tenants_session_is_not_found(
    gateway: DeployedGateway, namespace: str, session: str
) -> None:
    key = gateway.add_tenant(f"{namespace[:50]}-mallory", namespace)

    with gateway.client(key) as mallory:
        answers = [
            mallory.get(f"/v1/sessions/{session}"),
            mallory.post(f"/v1/sessions/{session}/executions", json={"code": "print(1)"}),
            mallory.get(f"/v1/sessions/{session}/files/a.txt"),
            mallory.delete(f"/v1/sessions/{session}"),
        ]

    assert [answer.status_code for answer in answers] == [404] * 4
    assert {answer.json()["error"]["code"] for answer in answers} == {"not_found"}


def test_a_file_uploaded_downloads_the_same(alice: httpx.Client, session: str) -> None:
    content = "name,value\nanswer,42\n"

    uploaded = alice.put(f"/v1/sessions/{session}/files/data/in.csv", content=content.encode())
    read = run_in(alice, session, "open('data/in.csv').read().splitlines()[1]")
    downloaded = alice.get(f"/v1/sessions/{session}/files/data/in.csv")
    missing = alice.get(f"/v1/sessions/{session}/files/none.txt")

    assert uploaded.status_code == 200, uploaded.text
    assert read["result"] == "'answer,42'"
    assert downloaded.status_code == 200, downloaded.text
    assert downloaded.content == content.encode()
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "file_not_found")


WRITES_AN_OUTPUT = (
    "import os\n"
    "open(os.path.join(os.environ['SANDPOD_OUTPUTS'], 'report.txt'), 'w').write('run one')\n"
)


def test_a_runs_output_files_come_back_and_the_next_run_starts_without_them(
    alice: httpx.Client, session: str
) -> None:
    first = run_in(alice, session, WRITES_AN_OUTPUT)
    second = run_in(alice, session, "print('nothing written')")
    fetched = alice.get(f"/v1/executions/{first['id']}/files/report.txt")

    assert first["status"] == "success", first
    assert [entry["path"] for entry in first["files"]] == ["report.txt"]
    assert (fetched.status_code, fetched.content) == (200, b"run one")
    assert (second["status"], second["files"]) == ("success", []), second


def test_a_run_is_answered_directly_and_recorded_behind(
    alice: httpx.Client, session: str, namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    answer = run_in(alice, session, "print('direct')")

    record = wait_for(custom_objects, namespace, answer["id"], timeout=RECORD_TIMEOUT)
    assert (answer["status"], answer["stdout"]) == ("success", "direct\n")
    assert record["metadata"]["labels"][RECORD_LABEL] == RECORD_DIRECT
    assert record["metadata"].get("finalizers") is None  # no handler reconciles a record
    assert (record["status"]["stdout"], record["status"]["session"]) == ("direct\n", session)


def unanswered_record(
    objects: client.CustomObjectsApi, namespace: str, session: str, answered: str
) -> str:
    """The name of the record of the session's run in progress (written as the run starts),
    not that of the `answered` run, whose status may still be on its way (written behind)."""

    def find() -> str | None:
        records = objects.list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, label_selector=f"{RECORD_LABEL}={RECORD_DIRECT}"
        )["items"]
        names = [
            record["metadata"]["name"]
            for record in records
            if record["spec"].get("session") == session
            and not record.get("status")
            and record["metadata"]["name"] != answered
        ]
        return names[0] if names else None

    return wait_until(find, timeout=RECORD_TIMEOUT, what="the record of the run in progress")


SLEEPS = "x += 1\nprint('started', flush=True)\nimport time\ntime.sleep(120)"


def test_deleting_a_running_session_run_interrupts_it_and_keeps_the_session(
    alice: httpx.Client, session: str, namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    first = run_in(alice, session, "x = 41")
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(run_in, alice, session, SLEEPS)
        name = unanswered_record(custom_objects, namespace, session, answered=first["id"])
        cancel = alice.delete(f"/v1/executions/{name}")
        answer = running.result(timeout=REQUEST_TIMEOUT)

    assert cancel.status_code == 202, cancel.text
    assert (answer["id"], answer["status"]) == (name, "cancelled"), answer
    assert answer["stdout"] == "started\n"
    assert "KeyboardInterrupt" in answer["stderr"]
    after = run_in(alice, session, "x")
    assert (after["result"], after["state_lost"]) == ("42", False), after
    record = wait_for(custom_objects, namespace, name, timeout=RECORD_TIMEOUT)
    assert (record["status"]["phase"], record["status"]["reason"]) == ("Cancelled", "Cancelled")


COUNTS = "n = globals().get('n', 0) + 1\nn"


def test_concurrent_runs_of_a_session_each_run_once_one_at_a_time(
    alice: httpx.Client, session: str
) -> None:
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda _: run_in(alice, session, COUNTS), range(6)))

    assert sorted(int(answer["result"]) for answer in answers) == [1, 2, 3, 4, 5, 6]
    assert run_in(alice, session, "n")["result"] == "6"


def test_a_retry_with_the_same_idempotency_key_runs_nothing_twice(
    alice: httpx.Client, session: str
) -> None:
    key = {"Idempotency-Key": "count-once"}
    url = f"/v1/sessions/{session}/executions"

    first = alice.post(url, json={"code": COUNTS}, headers=key)
    again = alice.post(url, json={"code": COUNTS}, headers=key)

    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert first.json()["id"] == again.json()["id"]
    assert (first.json()["result"], again.json()["result"]) == ("1", "1")
    assert run_in(alice, session, "n")["result"] == "1"


async def test_an_mcp_client_opens_a_session_runs_twice_and_closes_it(
    gateway: DeployedGateway, namespace: str
) -> None:
    key = gateway.add_tenant(namespace, namespace)

    async with gateway.mcp(key) as mcp:
        opened = await mcp.call_tool("open_session", {"language": "python"})
        assert not opened.is_error, opened.content
        assert opened.structured_content is not None
        session_id = opened.structured_content["id"]
        first = await mcp.call_tool(
            "run_in_session", {"session_id": session_id, "code": "import math\nr = 2"}
        )
        second = await mcp.call_tool(
            "run_in_session", {"session_id": session_id, "code": "round(math.pi * r * r, 2)"}
        )
        closed = await mcp.call_tool("close_session", {"session_id": session_id})

    assert not first.is_error, first.content
    assert not second.is_error, second.content
    assert second.structured_content is not None
    assert second.structured_content["status"] == "success"
    assert second.structured_content["result"] == "12.57"
    assert not closed.is_error, closed.content


# Connects to each address given (host:port); prints one verdict per address.
CONNECTS = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        print(target, "open")
    except OSError as error:
        print(target, "refused" if isinstance(error, ConnectionRefusedError) else "blocked")
"""


def test_only_the_gateway_reaches_the_operators_direct_path(
    sandpod_release: ChartRelease, core_v1: client.CoreV1Api, namespace: str
) -> None:
    """A pod of another namespace that no NetworkPolicy confines reaches the API server (its
    network works) but not the operator's direct port, by its Service or its pod."""
    operator = sandpod_release.component("operator")
    [operator_pod] = operator.pods()
    service: Any = core_v1.read_namespaced_service(operator.name, sandpod_release.namespace)
    api_service: Any = core_v1.read_namespaced_service("kubernetes", "default")
    targets = [
        f"{api_service.spec.cluster_ip}:443",
        f"{service.spec.cluster_ip}:{service.spec.ports[0].port}",
        f"{operator_pod.status.pod_ip}:{service.spec.ports[0].port}",
    ]

    printed = run_probe(core_v1, namespace, CONNECTS, targets)

    verdicts = dict(line.split(" ", 1) for line in printed.splitlines())
    assert verdicts[targets[0]] == "open", printed
    assert verdicts[targets[1]] in ("blocked", "refused"), printed
    assert verdicts[targets[2]] in ("blocked", "refused"), printed


def run_probe(core_v1: client.CoreV1Api, namespace: str, code: str, args: list[str]) -> str:
    """What `code` printed in a plain pod (the python image, gVisor, no NetworkPolicy)."""
    image = load_catalog().languages["python"].image
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="probe"),
        spec=client.V1PodSpec(
            runtime_class_name="gvisor",
            restart_policy="Never",
            automount_service_account_token=False,
            containers=[
                client.V1Container(
                    name="probe",
                    image=image,
                    image_pull_policy="IfNotPresent",
                    command=["python3", "-c", code, *args],
                )
            ],
        ),
    )
    core_v1.create_namespaced_pod(namespace, pod)
    wait_for_pod(core_v1, namespace, "probe", until=pod_finished, timeout=120, what="the probe")
    return str(core_v1.read_namespaced_pod_log("probe", namespace))

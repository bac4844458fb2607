"""Judge0 CE's API end to end, spoken by its official client (`judge0` from PyPI, pinned,
unchanged) to the chart's gateway: every submission a CodeExecution run by the operator in a
gVisor sandbox, every verdict Judge0's.

SANDPOD_E2E_JUDGE0_GATEWAY=local serves the same tests from a gateway process of this tree
(tenants read from the release's keys Secret), for a cluster whose gateway image predates the
Judge0 API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import judge0
import pytest
from chart_release import ChartRelease, DeployedGateway
from kubernetes import client
from pool_helpers import (
    namespace_with_pools,
    start_pool,
    wait_for_refill,
)
from sandpod_contract.names import QUEUED_LABEL
from sandpod_testkit.components import GatewayProcess
from sandpod_testkit.kube import GROUP, PLURAL, VERSION, delete_executions
from sandpod_testkit.waiting import wait_until

SEGFAULT = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
FLOATING_POINT = "import os, signal\nos.kill(os.getpid(), signal.SIGFPE)\n"
ABORT = "import os\nos.abort()\n"


@pytest.fixture(scope="module")
def judge0_gateway(
    gateway: DeployedGateway,
    sandpod_release: ChartRelease,
    kubeconfig_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """The URL of the gateway's Judge0 API: the chart's gateway, or (see above) this tree's."""
    if os.environ.get("SANDPOD_E2E_JUDGE0_GATEWAY") != "local":
        yield f"{gateway.url}/judge0"
        return
    process = GatewayProcess(
        kubeconfig=kubeconfig_path,
        keys_namespace=sandpod_release.namespace,
        keys_secret=f"{sandpod_release.name}-api-keys",
        log_path=tmp_path_factory.mktemp("judge0-gateway") / "gateway.log",
        settings={"SANDPOD_GATEWAY_API_KEYS_REFRESH_SECONDS": "1"},
    )
    process.start()
    try:
        yield f"{process.url}/judge0"
    finally:
        process.stop()


def add_tenant(
    gateway: DeployedGateway,
    judge0_gateway: str,
    name: str,
    namespace: str,
    max_concurrent: int = 20,
) -> str:
    """A tenant running `max_concurrent` submissions at once (more wait in its queue): its key,
    once the Judge0 API accepts it."""
    key = gateway.add_tenant(name, namespace, maxTimeoutSeconds=30, maxConcurrent=max_concurrent)
    wait_until(
        lambda: httpx.get(f"{judge0_gateway}/about", headers={"X-Auth-Token": key}).is_success,
        timeout=60,
        what=f"{judge0_gateway} to accept the key of tenant {name}",
    )
    return key


@pytest.fixture
def key(gateway: DeployedGateway, judge0_gateway: str, namespace: str) -> str:
    return add_tenant(gateway, judge0_gateway, namespace, namespace)


@pytest.fixture
def client_of(judge0_gateway: str, key: str) -> judge0.Client:
    return judge0.Client(endpoint=judge0_gateway, headers={"X-Auth-Token": key})


# A Judge0 client of a new tenant, serving a fresh namespace of its own, and that namespace.
TenantOfItsOwn = Callable[..., tuple[str, judge0.Client]]


@pytest.fixture
def tenant_of_its_own(
    gateway: DeployedGateway,
    judge0_gateway: str,
    namespace_prefix: str,
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
) -> Iterator[TenantOfItsOwn]:
    """Makes a fresh namespace named after `name` and a tenant serving it (see add_tenant);
    afterwards each namespace's executions, pools and sessions are deleted before it is."""
    with ExitStack() as cleanups:

        def make(name: str, max_concurrent: int = 20) -> tuple[str, judge0.Client]:
            namespace = f"{namespace_prefix}-{name}-{uuid.uuid4().hex[:6]}"
            cleanups.enter_context(namespace_with_pools(namespace, core_v1, custom_objects))
            cleanups.callback(delete_executions, custom_objects, namespace, timeout=60)
            key = add_tenant(gateway, judge0_gateway, namespace, namespace, max_concurrent)
            return namespace, judge0.Client(endpoint=judge0_gateway, headers={"X-Auth-Token": key})

        yield make


def test_test_cases_get_accepted_and_wrong_answer(client_of: judge0.Client) -> None:
    submissions = judge0.run(
        client=client_of,
        source_code="a, b = map(int, input().split())\nprint(a + b)\n",
        language=judge0.PYTHON,
        test_cases=[("2 2\n", "4"), ("2 3\n", "6"), ("1 1\n", "2\n\n")],
    )
    assert [s.status for s in submissions] == [
        judge0.Status.ACCEPTED,
        judge0.Status.WRONG_ANSWER,
        judge0.Status.ACCEPTED,
    ], [(s.status, s.stdout, s.stderr, s.message) for s in submissions]
    assert [s.stdout for s in submissions] == ["4\n", "5\n", "2\n"]
    assert all(s.time is not None and s.time > 0 for s in submissions)
    if os.environ.get("SANDPOD_E2E_JUDGE0_GATEWAY") != "local":
        # The chart's operator (of this tree) writes the runner's peak memory.
        assert all(s.memory is not None and s.memory > 1000 for s in submissions)


def test_every_runtime_verdict_from_the_sandbox(client_of: judge0.Client) -> None:
    cases = {
        "nzec": (judge0.PYTHON, "import sys\nsys.exit(3)\n", {}),
        "segv": (judge0.PYTHON, SEGFAULT, {}),
        "fpe": (judge0.PYTHON, FLOATING_POINT, {}),
        "abort": (judge0.PYTHON, ABORT, {}),
        "killed": (judge0.BASH, "kill -9 $$\n", {}),
        "tle": (judge0.BASH, "sleep 60\n", {"cpu_time_limit": 2, "wall_time_limit": 3}),
        "xfsz": (judge0.PYTHON, "print('y' * 5000)\n", {"max_file_size": 1}),
        "ce": (judge0.GO, "package main\nfunc main() { x }\n", {}),
    }
    submissions = judge0.run(
        client=client_of,
        submissions=[
            judge0.Submission(source_code=source, language=language, **limits)
            for language, source, limits in cases.values()
        ],
    )
    seen = dict(zip(cases, submissions, strict=True))
    verdicts = {name: s.status for name, s in seen.items()}
    assert verdicts == {
        "nzec": judge0.Status.RUNTIME_ERROR_NZEC,
        "segv": judge0.Status.RUNTIME_ERROR_SIGSEGV,
        "fpe": judge0.Status.RUNTIME_ERROR_SIGFPE,
        "abort": judge0.Status.RUNTIME_ERROR_SIGABRT,
        "killed": judge0.Status.RUNTIME_ERROR_OTHER,
        "tle": judge0.Status.TIME_LIMIT_EXCEEDED,
        "xfsz": judge0.Status.RUNTIME_ERROR_SIGXFSZ,
        "ce": judge0.Status.COMPILATION_ERROR,
    }, {name: (s.status, s.message, s.stderr) for name, s in seen.items()}
    assert (seen["nzec"].exit_code, seen["nzec"].exit_signal) == (3, None)
    assert [seen[name].exit_signal for name in ("segv", "fpe", "abort", "killed")] == [11, 8, 6, 9]
    assert "x" in (seen["ce"].compile_output or "")
    assert seen["ce"].stdout is None


def test_text_arguments_and_additional_files_reach_the_program(client_of: judge0.Client) -> None:
    files = judge0.Filesystem(
        content=[
            judge0.File(name="helper.py", content="GREETING = 'héllo'\n"),
            judge0.File(name="data/input.txt", content="from a file\n"),
        ]
    )
    submission = judge0.run(
        client=client_of,
        source_code=(
            "import sys\nfrom helper import GREETING\n"
            "print(GREETING, sys.argv[1:], input(), open('data/input.txt').read().strip())\n"
        ),
        language=judge0.PYTHON,
        stdin="ünïcode\n",
        command_line_arguments="one 'two words'",
        additional_files=files,
    )
    assert submission.status == judge0.Status.ACCEPTED, (submission.stderr, submission.message)
    assert submission.stdout == "héllo ['one', 'two words'] ünïcode from a file\n"


def test_each_submission_is_a_code_execution_of_its_tenant_only(
    client_of: judge0.Client,
    judge0_gateway: str,
    gateway: DeployedGateway,
    namespace: str,
    custom_objects: client.CustomObjectsApi,
) -> None:
    submission = judge0.run(client=client_of, source_code="print(1)", language=judge0.PYTHON)
    token = str(submission.token)
    execution: Any = custom_objects.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, token
    )
    assert execution["status"]["phase"] == "Succeeded"
    # Another tenant (the same namespace, even) gets no answer about it.
    other = add_tenant(gateway, judge0_gateway, f"{namespace[:50]}-b", namespace)
    answer = httpx.get(f"{judge0_gateway}/submissions/{token}", headers={"X-Auth-Token": other})
    assert answer.status_code == 404
    batch = httpx.get(
        f"{judge0_gateway}/submissions/batch",
        params={"tokens": token},
        headers={"X-Auth-Token": other},
    )
    assert batch.json() == {"submissions": [None]}


def test_the_implicit_client_reads_its_endpoint_and_key_from_the_environment(
    judge0_gateway: str, key: str
) -> None:
    """As with make run's .cluster/judge0.env: nothing but the environment changes."""
    env = {
        **os.environ,
        "JUDGE0_CE_ENDPOINT": judge0_gateway,
        "JUDGE0_CE_AUTH_HEADERS": json.dumps({"X-Auth-Token": key}),
    }
    program = (
        "import judge0\n"
        "s = judge0.run(source_code='print(6 * 7)', language=judge0.PYTHON)\n"
        "print(s.status.name, s.stdout.strip())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ACCEPTED", "42"]


def test_version_authentication_and_every_language_as_judge0_answers(
    judge0_gateway: str, key: str
) -> None:
    """GET /version is the version as text; POST /authenticate is 200 for the tenant's key and
    401 for another; POST /authorize is 403 (Judge0's authorization guards calls sandpod does
    not serve); GET /languages/all is /languages with is_archived, none archived."""
    headers = {"X-Auth-Token": key}
    version = httpx.get(f"{judge0_gateway}/version", headers=headers)
    assert (version.status_code, version.text) == (200, "1.13.1"), version.text
    assert httpx.post(f"{judge0_gateway}/authenticate", headers=headers).status_code == 200
    wrong = {"X-Auth-Token": f"wrong-{uuid.uuid4().hex}"}
    assert httpx.post(f"{judge0_gateway}/authenticate", headers=wrong).status_code == 401
    authorize = httpx.post(f"{judge0_gateway}/authorize", headers={**headers, "X-Auth-User": key})
    assert authorize.status_code == 403, authorize.text
    listed = httpx.get(f"{judge0_gateway}/languages/all", headers=headers)
    assert listed.status_code == 200, listed.text
    active = httpx.get(f"{judge0_gateway}/languages", headers=headers).json()
    assert [{"id": e["id"], "name": e["name"]} for e in listed.json()] == active
    assert not any(entry["is_archived"] for entry in listed.json())
    assert {entry["id"] for entry in active} >= {71, 46, 60}


def batch_wait() -> judge0.MaxWaitTime:
    """The client's own strategy polls forever: a bound (it counts the time it sleeps)."""
    return judge0.MaxWaitTime(max_wait_time_sec=600)


def executions_of(objects: client.CustomObjectsApi, namespace: str, tokens: list[str]) -> list[Any]:
    return [
        objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, token)
        for token in tokens
    ]


GO_SUM = (
    'package main\n\nimport "fmt"\n\nfunc main() {\n'
    "\tvar a, b int\n\tfmt.Scan(&a, &b)\n\tfmt.Println(a + b)\n}\n"
)
# Larger than a submission's defaults, so a submission fits the pool's sandboxes.
POOL_RESOURCES = {"cpu": "1", "memory": "512Mi"}


def test_go_submissions_are_built_and_run_in_a_ready_pool_sandbox(
    tenant_of_its_own: TenantOfItsOwn,
    custom_objects: client.CustomObjectsApi,
    core_v1: client.CoreV1Api,
) -> None:
    namespace, client_of = tenant_of_its_own("j0pool")
    start_pool(custom_objects, namespace, 1, name="go", language="go", resources=POOL_RESOURCES)
    accepted = judge0.run(
        client=client_of,
        source_code=GO_SUM,
        language=judge0.GO,
        stdin="2 3",
        expected_output="5",
        cpu_time_limit=1,
    )
    assert accepted.status == judge0.Status.ACCEPTED, (
        accepted.status,
        accepted.compile_output,
        accepted.stderr,
        accepted.message,
    )
    [served] = executions_of(custom_objects, namespace, [str(accepted.token)])
    wait_for_refill(core_v1, namespace, "go", served["status"]["podName"])
    broken = judge0.run(
        client=client_of,
        source_code="package main\nfunc main() { undefinedThing() }\n",
        language=judge0.GO,
        cpu_time_limit=1,
    )
    assert broken.status == judge0.Status.COMPILATION_ERROR, (broken.status, broken.message)
    assert "undefinedThing" in (broken.compile_output or "")
    assert broken.stdout is None
    tokens = [str(s.token) for s in (accepted, broken)]
    statuses = [e["status"] for e in executions_of(custom_objects, namespace, tokens)]
    # Each was served by a pool sandbox, the build included.
    assert [s.get("startMode") for s in statuses] == ["warm", "warm"], statuses
    assert statuses[-1].get("reason") == "CompilationError", statuses


def class_batch(count: int) -> list[tuple[judge0.Submission, judge0.Status]]:
    """`count` submissions of a class with every verdict kind, and the verdict each must get:
    in each ten, one wrong answer, time limit, build failure and runtime error; the rest
    accepted."""
    source = "a, b = map(int, input().split())\nprint(a + b)\n"
    python = judge0.PYTHON
    kinds: list[tuple[dict[str, Any], judge0.Status]] = [
        (
            {"source_code": source, "stdin": "2 3", "expected_output": "6"},
            judge0.Status.WRONG_ANSWER,
        ),
        (
            {"source_code": "while True: pass\n", "cpu_time_limit": 1, "wall_time_limit": 2},
            judge0.Status.TIME_LIMIT_EXCEEDED,
        ),
        (
            {"source_code": "package main\nfunc main() { x }\n", "language": judge0.GO},
            judge0.Status.COMPILATION_ERROR,
        ),
        ({"source_code": "import sys\nsys.exit(2)\n"}, judge0.Status.RUNTIME_ERROR_NZEC),
    ]
    accepted = (
        {"source_code": source, "stdin": "2 3", "expected_output": "5"},
        judge0.Status.ACCEPTED,
    )
    batch = []
    for i in range(count):
        fields, verdict = kinds[i % 10] if i % 10 < len(kinds) else accepted
        batch.append((judge0.Submission(**{"language": python, **fields}), verdict))
    return batch


def queued_now(objects: client.CustomObjectsApi, namespace: str) -> int:
    listed: Any = objects.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=QUEUED_LABEL
    )
    return len(listed["items"])


def test_a_batch_beyond_max_concurrent_waits_in_queue_and_every_verdict_is_right(
    gateway: DeployedGateway,
    judge0_gateway: str,
    namespace: str,
    custom_objects: client.CustomObjectsApi,
) -> None:
    key = add_tenant(gateway, judge0_gateway, namespace, namespace, max_concurrent=4)
    client_of = judge0.Client(endpoint=judge0_gateway, headers={"X-Auth-Token": key})
    batch = class_batch(20)
    created = judge0.async_execute(
        client=client_of, submissions=[submission for submission, _ in batch]
    )
    # Beyond maxConcurrent they wait (Judge0's In Queue), none refused.
    assert queued_now(custom_objects, namespace) > 0
    waited = judge0.wait(client=client_of, submissions=created, retry_strategy=batch_wait())
    verdicts = [s.status for s in waited]
    assert verdicts == [want for _, want in batch], [
        (s.status, s.stderr, s.message) for s in waited
    ]
    assert queued_now(custom_objects, namespace) == 0


def test_one_tenants_batch_does_not_starve_anothers(
    tenant_of_its_own: TenantOfItsOwn, custom_objects: client.CustomObjectsApi
) -> None:
    """Alice queues 12 submissions first, Bob 4 right after: each tenant's queue waits on its
    own running submissions only, so Bob's are done before Alice's are."""
    clients = {}
    namespaces = {}
    for tenant in ("alice", "bob"):
        namespaces[tenant], clients[tenant] = tenant_of_its_own(f"j0-{tenant}", max_concurrent=2)

    def programs(count: int) -> list[judge0.Submission]:
        source = "import time\ntime.sleep(1)\nprint('ok')\n"
        return [
            judge0.Submission(source_code=source, language=judge0.PYTHON, expected_output="ok")
            for _ in range(count)
        ]

    alice = judge0.async_execute(client=clients["alice"], submissions=programs(12))
    bob = judge0.async_execute(client=clients["bob"], submissions=programs(4))
    done = {
        "alice": judge0.wait(
            client=clients["alice"], submissions=alice, retry_strategy=batch_wait()
        ),
        "bob": judge0.wait(client=clients["bob"], submissions=bob, retry_strategy=batch_wait()),
    }
    for submissions in done.values():
        assert [s.status for s in submissions] == [judge0.Status.ACCEPTED] * len(submissions)
    finished = {
        tenant: max(
            e["status"]["finishedAt"]
            for e in executions_of(
                custom_objects, namespaces[tenant], [str(s.token) for s in submissions]
            )
        )
        for tenant, submissions in done.items()
    }
    assert finished["bob"] < finished["alice"], finished

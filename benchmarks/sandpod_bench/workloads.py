"""The things the bench times: one `print(1)` through sandpod (kubectl, gateway, MCP, API) and
through each baseline (a Job, a bare pod, llm-sandbox). Each returns an Attempt; failures
are results too, never exceptions that end the bench."""

from __future__ import annotations

import asyncio
import copy
import json
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import yaml
from kubernetes import client
from sandpod_contract.catalog import Catalog
from sandpod_contract.names import GROUP, PLURAL, VERSION

from sandpod_bench import manifests
from sandpod_bench.containerd import ContainerdEvents
from sandpod_bench.kube import Manifest, list_raw, watch_events
from sandpod_bench.manifests import EXPECTED_STDOUT, LANGUAGE, PROGRAM
from sandpod_bench.recorder import Recorder

# Far beyond a healthy run (3-5 s); only a broken cluster gets there.
RUN_TIMEOUT_SECONDS = 180
# After the client returned, the terminal status must already be on its way.
STATUS_GRACE_SECONDS = 30


@dataclass
class Attempt:
    ok: bool
    seconds: float
    name: str = ""
    error: str | None = None
    # Wall-clock times the client itself knows: submitted, client_returned.
    milestones: dict[str, float] = field(default_factory=dict)


Workload = Callable[[int], Attempt]


def run_many(
    workload: Workload, *, runs: int, concurrency: int, think_seconds: float = 0.0
) -> list[Attempt]:
    """`runs` attempts, at most `concurrency` at a time, in index order. Each client pauses
    a random 0..`think_seconds` before each attempt: back-to-back runs would start in step
    with the kubelet's 1-second relist (the previous result arrived on one of its ticks), and
    every run would see the same phase of it instead of a random one, as real arrivals do."""

    def attempt(index: int) -> Attempt:
        if think_seconds > 0:
            time.sleep(random.uniform(0, think_seconds))
        return _guarded(workload, index)

    if concurrency <= 1:
        return [attempt(index) for index in range(runs)]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(attempt, range(runs)))


def _guarded(workload: Workload, index: int) -> Attempt:
    started = time.perf_counter()
    try:
        return workload(index)
    except Exception as error:
        return Attempt(
            False, time.perf_counter() - started, error=f"{type(error).__name__}: {error}"
        )


def _verdict(recorder: Recorder, name: str) -> str | None:
    """None when the execution succeeded with the expected output, else what went wrong."""
    observation = recorder.wait_terminal(name, STATUS_GRACE_SECONDS)
    if observation is None:
        return "no terminal status seen"
    if observation.phase != "Succeeded":
        status = (observation.execution or {}).get("status") or {}
        return f"{observation.phase}/{status.get('reason')}: {status.get('message')}"
    if observation.stdout != EXPECTED_STDOUT:
        return f"unexpected stdout {observation.stdout!r}"
    return None


# --- sandpod ------------------------------------------------------------------------------


@dataclass
class SandpodKubectl:
    """`kubectl apply -f -`, then `kubectl wait --for=condition=Completed`, as a user would."""

    kubectl: str
    kubeconfig: Path
    namespace: str
    recorder: Recorder
    prefix: str
    session: str | None = None

    def __call__(self, index: int) -> Attempt:
        name = f"{self.prefix}-{index}"
        document = yaml.safe_dump(
            manifests.code_execution(name, namespace=self.namespace, session=self.session)
        )
        env = {"KUBECONFIG": str(self.kubeconfig), "PATH": "/usr/bin:/bin"}
        submitted = time.time()
        started = time.perf_counter()
        applied = subprocess.run(
            [self.kubectl, "apply", "-f", "-"],
            input=document,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        if applied.returncode != 0:
            return Attempt(False, time.perf_counter() - started, name, applied.stderr.strip())
        waited = subprocess.run(
            [
                self.kubectl,
                "wait",
                "--for=condition=Completed",
                f"codeexecution/{name}",
                f"--namespace={self.namespace}",
                f"--timeout={RUN_TIMEOUT_SECONDS}s",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=RUN_TIMEOUT_SECONDS + 30,
        )
        seconds = time.perf_counter() - started
        milestones = {"submitted": submitted, "client_returned": time.time()}
        if waited.returncode != 0:
            return Attempt(False, seconds, name, waited.stderr.strip(), milestones)
        problem = _verdict(self.recorder, name)
        return Attempt(problem is None, seconds, name, problem, milestones)


def json_body(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object, or {} when it is none."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def timed_post(
    http: httpx.Client, path: str, **request: Any
) -> tuple[httpx.Response, dict[str, Any], float, dict[str, float]]:
    """POST, timed: the answer, its JSON object, the seconds it took and the client's
    milestones (submitted, client_returned)."""
    submitted = time.time()
    started = time.perf_counter()
    response = http.post(path, **request)
    seconds = time.perf_counter() - started
    milestones = {"submitted": submitted, "client_returned": time.time()}
    return response, json_body(response), seconds, milestones


@dataclass
class SandpodGateway:
    """POST /v1/executions (or a session's executions) and wait for the result (the
    gateway's default); print(1) in python unless told another program."""

    http: httpx.Client
    recorder: Recorder
    path: str = "/v1/executions"
    language: str = LANGUAGE
    program: str = PROGRAM
    expected_stdout: str = EXPECTED_STDOUT

    def __call__(self, index: int) -> Attempt:
        response, body, seconds, milestones = timed_post(
            self.http,
            self.path,
            json={"language": self.language, "code": self.program},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        name = str(body.get("id") or "")
        if response.status_code != 200:
            problem = f"HTTP {response.status_code}: {response.text[:300]}"
            return Attempt(False, seconds, name, problem, milestones)
        if body.get("status") != "success" or body.get("stdout") != self.expected_stdout:
            problem = f"{body.get('status')}: {body.get('error_message')} {body.get('stdout')!r}"
            return Attempt(False, seconds, name, problem, milestones)
        return Attempt(True, seconds, name, None, milestones)


# Judge0's id of Python 3 (its CE 1.13.1 list), and its status "Accepted".
JUDGE0_PYTHON = 71
JUDGE0_ACCEPTED = 3


@dataclass
class Judge0Submission:
    """print(1) through the gateway's Judge0 API: POST /judge0/submissions?wait=true, as
    Judge0's clients submit (its token is the execution's name)."""

    http: httpx.Client

    def __call__(self, index: int) -> Attempt:
        response, body, seconds, milestones = timed_post(
            self.http,
            "/judge0/submissions",
            params={"wait": "true", "fields": "token,stdout,status"},
            json={"source_code": PROGRAM, "language_id": JUDGE0_PYTHON},
        )
        name = str(body.get("token") or "")
        if response.status_code != 201:
            problem = f"HTTP {response.status_code}: {response.text[:300]}"
            return Attempt(False, seconds, name, problem, milestones)
        status = body.get("status") or {}
        if status.get("id") != JUDGE0_ACCEPTED or body.get("stdout") != EXPECTED_STDOUT:
            problem = f"{status.get('description')}: {body.get('stdout')!r}"
            return Attempt(False, seconds, name, problem, milestones)
        return Attempt(True, seconds, name, None, milestones)


@dataclass
class SandpodApi:
    """Create the CodeExecution through the API and wait for its status (the bench's own
    watch): what a platform that talks to Kubernetes directly does."""

    custom: client.CustomObjectsApi
    namespace: str
    recorder: Recorder
    prefix: str

    def __call__(self, index: int) -> Attempt:
        name = f"{self.prefix}-{index}"
        submitted = time.time()
        started = time.perf_counter()
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, manifests.code_execution(name)
        )
        observation = self.recorder.wait_terminal(name, RUN_TIMEOUT_SECONDS)
        seconds = time.perf_counter() - started
        milestones = {"submitted": submitted, "client_returned": time.time()}
        if observation is None:
            return Attempt(False, seconds, name, "no terminal status", milestones)
        problem = _verdict(self.recorder, name)
        return Attempt(problem is None, seconds, name, problem, milestones)


# --- baselines ----------------------------------------------------------------------------


def _create(create_method: Callable[..., Any], namespace: str, body: Manifest) -> Manifest:
    """Create and answer the created object as a dict."""
    response = create_method(namespace, body, _preload_content=False)
    created: Manifest = json.loads(response.data)
    return created


def _wait_for(
    list_method: Callable[..., Any],
    namespace: str,
    name: str,
    resource_version: str,
    done: Callable[[Manifest], bool],
    seen: Callable[[Manifest], None] | None = None,
) -> Manifest:
    """Watch one object (from the version its create answered) until `done(object)`;
    `seen` is called with every state on the way."""
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    while (remaining := deadline - time.monotonic()) > 0:
        for _, item in watch_events(
            list_method,
            namespace,
            field_selector=f"metadata.name={name}",
            resource_version=resource_version,
            timeout_seconds=max(1, int(remaining)),
        ):
            resource_version = item["metadata"]["resourceVersion"]
            if seen is not None:
                seen(item)
            if done(item):
                return item
    raise TimeoutError(f"{name} did not finish within {RUN_TIMEOUT_SECONDS}s")


def _delete_quietly(delete: Callable[[], Any]) -> None:
    """Delete after timing; already gone is fine."""
    try:
        delete()
    except client.ApiException as error:
        if error.status != 404:
            raise


def _phase(pod: Manifest) -> str | None:
    return (pod.get("status") or {}).get("phase")


def _container_terminated(pod: Manifest) -> bool:
    """The earliest sign that the log is complete: the container's terminated state (the
    pod's phase turns Succeeded only after the sandbox is stopped, about a second later)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any((s.get("state") or {}).get("terminated") for s in statuses) or _phase(pod) in (
        "Succeeded",
        "Failed",
    )


def _exit_code(pod: Manifest) -> int | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated:
            return int(terminated.get("exitCode", -1))
    return None


def _job_finished(job: Manifest) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


@dataclass
class BarePod:
    """A minimal script: create the pod, watch it until its container ended, read its log."""

    core: client.CoreV1Api
    namespace: str
    sandbox: Manifest
    catalog: Catalog
    prefix: str
    containerd: ContainerdEvents | None = None

    def __call__(self, index: int) -> Attempt:
        name = f"{self.prefix}-{index}"
        pod = manifests.baseline_pod(
            self.sandbox, namespace=self.namespace, name=name, kind="pod", catalog=self.catalog
        )
        milestones: dict[str, float] = {}

        def seen(state: Manifest) -> None:
            if (state.get("spec") or {}).get("nodeName"):
                milestones.setdefault("pod_scheduled", time.time())

        milestones["submitted"] = time.time()
        started = time.perf_counter()
        try:
            created = _create(self.core.create_namespaced_pod, self.namespace, pod)
            # No operator: created, seen and "its pod created" are one moment.
            for milestone in ("created", "operator_seen", "pod_created"):
                milestones[milestone] = time.time()
            finished = _wait_for(
                self.core.list_namespaced_pod,
                self.namespace,
                name,
                created["metadata"]["resourceVersion"],
                _container_terminated,
                seen,
            )
            milestones["exit_reported"] = time.time()
            log = self.core.read_namespaced_pod_log(name, self.namespace)
            seconds = time.perf_counter() - started
            milestones["status_written"] = milestones["client_returned"] = time.time()
        finally:
            _delete_quietly(
                lambda: self.core.delete_namespaced_pod(
                    name, self.namespace, grace_period_seconds=0
                )
            )
        self._add_container_times(milestones, name, finished)
        if _exit_code(finished) != 0 or log != EXPECTED_STDOUT:
            problem = f"exit code {_exit_code(finished)}: {log!r}"
            return Attempt(False, seconds, name, problem, milestones)
        return Attempt(True, seconds, name, None, milestones)

    def _add_container_times(self, milestones: dict[str, float], name: str, pod: Manifest) -> None:
        if self.containerd is None:
            return
        sandbox = self.containerd.sandbox(self.namespace, name)
        if sandbox is not None:
            _put(milestones, "sandbox_created", sandbox.created)
            _put(milestones, "sandbox_started", sandbox.started)
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            container = self.containerd.container(str(status.get("containerID") or ""))
            if container is not None:
                _put(milestones, "runner_started", container.started)
                _put(milestones, "program_exited", container.exited)


def _put(milestones: dict[str, float], name: str, value: float | None) -> None:
    if value is not None:
        milestones[name] = value


@dataclass
class JobBaseline:
    """A Job running the same code: create until its Complete condition, then its log."""

    batch: client.BatchV1Api
    core: client.CoreV1Api
    namespace: str
    sandbox: Manifest
    catalog: Catalog
    prefix: str

    def __call__(self, index: int) -> Attempt:
        name = f"{self.prefix}-{index}"
        job = manifests.baseline_job(
            self.sandbox, namespace=self.namespace, name=name, catalog=self.catalog
        )
        started = time.perf_counter()
        try:
            created = _create(self.batch.create_namespaced_job, self.namespace, job)
            finished = _wait_for(
                self.batch.list_namespaced_job,
                self.namespace,
                name,
                created["metadata"]["resourceVersion"],
                _job_finished,
            )
            pods = list_raw(
                self.core.list_namespaced_pod,
                self.namespace,
                label_selector=f"batch.kubernetes.io/job-name={name}",
            )["items"]
            log = self.core.read_namespaced_pod_log(pods[0]["metadata"]["name"], self.namespace)
            seconds = time.perf_counter() - started
        finally:
            _delete_quietly(
                lambda: self.batch.delete_namespaced_job(
                    name, self.namespace, propagation_policy="Background", grace_period_seconds=0
                )
            )
        if not (finished.get("status") or {}).get("succeeded") or log != EXPECTED_STDOUT:
            return Attempt(False, seconds, name, f"the Job failed or logged {log!r}")
        return Attempt(True, seconds, name)


def _llm_sandbox_session(
    core: client.CoreV1Api, namespace: str, sandbox: Manifest, catalog: Catalog
) -> Any:
    """An unopened llm-sandbox session on the baselines' pod manifest."""
    from llm_sandbox import SandboxBackend, SandboxSession

    pod = manifests.llm_sandbox_pod(sandbox, namespace=namespace, catalog=catalog)
    return SandboxSession(
        backend=SandboxBackend.KUBERNETES,
        lang=LANGUAGE,
        image=pod["spec"]["containers"][0]["image"],
        client=core,
        kube_namespace=namespace,
        pod_manifest=copy.deepcopy(pod),
        workdir=manifests.SANDBOX_DIR,
        # Its Python setup makes a venv and upgrades pip from PyPI: the sandbox has no
        # network, and the image has what print(1) needs.
        skip_environment_setup=True,
    )


def _llm_sandbox_attempt(result: Any, seconds: float) -> Attempt:
    if result.exit_code != 0 or result.stdout != EXPECTED_STDOUT:
        return Attempt(
            False, seconds, "", f"exit {result.exit_code}: {result.stdout!r} {result.stderr!r}"
        )
    return Attempt(True, seconds)


@dataclass
class LlmSandbox:
    """llm-sandbox's Kubernetes backend: a session opens a pod (same image, RuntimeClass
    and limits), runs the code by exec, and the session's close deletes the pod."""

    core: client.CoreV1Api
    namespace: str
    sandbox: Manifest
    catalog: Catalog

    def __call__(self, index: int) -> Attempt:
        started = time.perf_counter()
        session = _llm_sandbox_session(self.core, self.namespace, self.sandbox, self.catalog)
        try:
            session.open()
            result = session.run(PROGRAM)
            seconds = time.perf_counter() - started
        finally:
            session.close()
        return _llm_sandbox_attempt(result, seconds)


@dataclass
class LlmSandboxSession:
    """llm-sandbox's own session: one pod opened once (`open`, not timed), then each
    attempt is one `run(print(1))` in it (the code copied in and run over exec);
    `close` deletes the pod."""

    core: client.CoreV1Api
    namespace: str
    sandbox: Manifest
    catalog: Catalog
    session: Any = None

    def open(self) -> None:
        self.session = _llm_sandbox_session(self.core, self.namespace, self.sandbox, self.catalog)
        self.session.open()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def __call__(self, index: int) -> Attempt:
        started = time.perf_counter()
        result = self.session.run(PROGRAM)
        return _llm_sandbox_attempt(result, time.perf_counter() - started)


class McpSession:
    """print(1) in a sandpod session through the gateway's MCP endpoint, with the official
    MCP client: one client connection (its initialize) opened outside the timing, then each
    attempt is one `run_in_session` tool call. The client lives in a thread of its own (its
    async contexts are entered and left by one task there)."""

    def __init__(self, url: str, key: str, session_id: str) -> None:
        self.url, self.key, self.session_id = url, key, session_id
        self._ready: Future[None] = Future()
        self._calls: asyncio.Queue[Future[Any] | None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)

    def open(self) -> None:
        self._thread.start()
        self._ready.result(timeout=60)

    def close(self) -> None:
        if self._loop is not None and self._calls is not None:
            self._loop.call_soon_threadsafe(self._calls.put_nowait, None)
        self._thread.join(timeout=30)

    async def _serve(self) -> None:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        self._loop, self._calls = asyncio.get_running_loop(), asyncio.Queue()
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {self.key}"}, timeout=RUN_TIMEOUT_SECONDS
        )
        try:
            async with (
                http,
                Client(streamable_http_client(f"{self.url}/mcp", http_client=http)) as mcp,
            ):
                self._ready.set_result(None)
                while (call := await self._calls.get()) is not None:
                    try:
                        call.set_result(
                            await mcp.call_tool(
                                "run_in_session", {"session_id": self.session_id, "code": PROGRAM}
                            )
                        )
                    except Exception as error:
                        call.set_exception(error)
        except Exception as error:
            if not self._ready.done():
                self._ready.set_exception(error)
            raise

    def __call__(self, index: int) -> Attempt:
        assert self._loop is not None and self._calls is not None, "open() first"
        call: Future[Any] = Future()
        submitted = time.time()
        started = time.perf_counter()
        self._loop.call_soon_threadsafe(self._calls.put_nowait, call)
        result = call.result(timeout=RUN_TIMEOUT_SECONDS + 30)
        seconds = time.perf_counter() - started
        milestones = {"submitted": submitted, "client_returned": time.time()}
        content: dict[str, Any] = result.structured_content or {}
        name = str(content.get("id") or "")
        if result.is_error or content.get("status") != "success":
            problem = f"{content.get('status')}: {content.get('error_message') or result.content}"
            return Attempt(False, seconds, name, problem, milestones)
        if content.get("stdout") != EXPECTED_STDOUT:
            return Attempt(False, seconds, name, f"stdout {content.get('stdout')!r}", milestones)
        return Attempt(True, seconds, name, None, milestones)


# --- E2B's SDK ------------------------------------------------------------------------------


def e2b_options(url: str, key: str) -> dict[str, Any]:
    """What .cluster/e2b.env gives E2B's SDK, as its own options."""
    return {"api_key": key, "api_url": f"{url}/e2b", "sandbox_url": f"{url}/e2b/sandbox"}


@dataclass
class E2bRunCode:
    """`sandbox.run_code("1")` with E2B's code interpreter SDK in one open sandbox: the
    trailing expression's `text` is the answer."""

    sandbox: Any  # e2b_code_interpreter.Sandbox

    def __call__(self, index: int) -> Attempt:
        started = time.perf_counter()
        execution = self.sandbox.run_code("1")
        seconds = time.perf_counter() - started
        if execution.error is not None or execution.text != "1":
            return Attempt(False, seconds, error=f"text {execution.text!r}, {execution.error}")
        return Attempt(True, seconds)


@dataclass
class E2bCommand:
    """`sandbox.commands.run("true")` with E2B's SDK in one open sandbox (envd's process
    API): exit code 0 is the answer."""

    sandbox: Any  # e2b.Sandbox

    def __call__(self, index: int) -> Attempt:
        started = time.perf_counter()
        result = self.sandbox.commands.run("true")
        seconds = time.perf_counter() - started
        if result.exit_code != 0:
            return Attempt(False, seconds, error=f"exit code {result.exit_code}")
        return Attempt(True, seconds)


@dataclass
class E2bCreate:
    """`Sandbox.create()`, then its first `run_code("1")` (E2B publishes the time to the first
    command). Not timed: `before()` (the bench waits there for its session pool to be full)
    and, once timed, `after(sandbox_id)`, then the sandbox's kill. The milestone `created` is
    when create returned, seconds from the start."""

    options: dict[str, Any]
    before: Callable[[], None]
    after: Callable[[str], None]

    def __call__(self, index: int) -> Attempt:
        from e2b_code_interpreter import Sandbox

        self.before()
        started = time.perf_counter()
        sandbox = Sandbox.create(**self.options)
        created = time.perf_counter() - started
        try:
            first = E2bRunCode(sandbox)(index)
            seconds = time.perf_counter() - started
            self.after(sandbox.sandbox_id)
        finally:
            sandbox.kill()
        return Attempt(first.ok, seconds, sandbox.sandbox_id, first.error, {"created": created})

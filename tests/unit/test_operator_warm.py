"""The warm path: which pool an execution fits (pure), the runner client against a real
local server speaking the serve protocol, and the Reconciler claiming pool pods in the
in-memory API server (claim races, earlier claims, drained pools, re-attach, a runner that
goes away, forged frames)."""

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import runner_wire
from fake_kube import FakeKube, Manifest, selects
from sandpod_contract.catalog import load_catalog
from sandpod_contract.models import CodeExecutionSpec
from sandpod_contract.names import (
    CLAIMED_BY_LABEL,
    DIRECT_TIMINGS_LOG,
    EXECUTION_LABEL,
    POOL_CLAIMED,
    POOL_FREE,
    POOL_STATE_LABEL,
    SERVES_TENANT_LABEL,
    TENANT_LABEL,
)
from sandpod_operator.executions.builders import plan_execution
from sandpod_operator.executions.reconciler import Reconciler
from sandpod_operator.kube import KubeError
from sandpod_operator.pools.warm import (
    TIMINGS_LOG,
    candidates,
    claim_patch,
    execution_wants,
    fitting_pools,
    parse_credential,
    read_pool,
    run_request,
)
from sandpod_operator.serving.core import NotServing
from sandpod_operator.serving.direct import DirectRuns
from sandpod_operator.serving.runner import RunnerAddress, RunnerUnavailable, run
from sandpod_operator.settings import OperatorSettings
from serve_double import Script, ServeDouble
from test_operator_reconciler import latest, status_of, submit

pytestmark = pytest.mark.usefixtures("clean_environment")

NAMESPACE = "team-a"
TAIL = 64 * 1024
LIMIT = 1024 * 1024


def settings(**overrides: Any) -> OperatorSettings:
    return OperatorSettings(**{"deadline_grace_seconds": 0.5, **overrides})


def pool(name: str = "py", language: str = "python", **resources: str) -> Manifest:
    spec = {"language": language, "size": 4, "resources": resources or {"memory": "512Mi"}}
    return {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def spec_of(**fields: Any) -> CodeExecutionSpec:
    return CodeExecutionSpec.model_validate({"language": "python", "source": "print(1)", **fields})


def fitting(
    pools: list[Manifest], config: OperatorSettings | None = None, **fields: Any
) -> list[str]:
    config = config or settings()
    spec = spec_of(**fields)
    plan = plan_execution(spec, load_catalog(), config)
    wanted = execution_wants(spec, plan)
    return [p.name for p in fitting_pools(wanted, pools, load_catalog(), config)]


# --- matching (pure) ----------------------------------------------------------------------


def test_a_run_of_the_pools_language_within_its_resources_fits() -> None:
    assert fitting([pool()]) == ["py"]
    assert fitting([pool()], resources={"memory": "512Mi", "cpu": "500m"}) == ["py"]


@pytest.mark.parametrize(
    "fields",
    [
        {"resources": {"memory": "1Gi"}},
        {"resources": {"cpu": "1"}},
        {"resources": {"ephemeralStorage": "512Mi"}},
        {"language": "bash", "source": "echo"},
        {"mode": "lint"},
        {"network": {"egress": "allowlist", "allow": [{"cidr": "203.0.113.0/24"}]}},
        {"runtimeClassName": "runc"},
    ],
)
def test_anything_beyond_the_pool_does_not_fit(fields: dict[str, Any]) -> None:
    config = settings(allowed_runtime_classes=["runc"])
    assert fitting([pool()], config, **fields) == []


def test_the_smallest_fitting_pool_comes_first_and_bad_pools_are_skipped() -> None:
    pools = [
        pool("big", memory="2Gi"),
        pool("small", memory="256Mi"),
        pool("mid", memory="512Mi"),
        pool("js", language="javascript"),
        {"metadata": {"name": "broken"}, "spec": {"language": "python", "resources": {"cpu": "x"}}},
    ]
    assert fitting(pools) == ["small", "mid", "big"]
    assert read_pool(pools[-1], load_catalog(), settings()) is None


def pool_pod(name: str, pool_name: str, *, ready: bool = True, **labels: str) -> Manifest:
    kube = FakeKube()
    pod = kube.add_pool_pod(
        NAMESPACE, name, pool=pool_name, port=1, credential="0" * 64, ready=ready
    )
    pod["metadata"]["labels"].update(labels)
    return pod


def test_candidates_are_free_ready_pods_of_the_fitting_pools_in_their_order() -> None:
    pools = [p for m in (pool("a"), pool("b")) if (p := read_pool(m, load_catalog(), settings()))]
    pods = [
        pool_pod("b-1", "b"),
        pool_pod("a-1", "a", ready=False),
        pool_pod("a-2", "a"),
        pool_pod("c-1", "c"),
        pool_pod("a-3", "a", **{POOL_STATE_LABEL: POOL_CLAIMED}),
    ]
    assert [p["metadata"]["name"] for p in candidates(pods, pools, "t")] == ["a-2", "b-1"]


def test_a_pod_that_served_a_tenant_serves_no_other() -> None:
    pools = [p for m in (pool("a"),) if (p := read_pool(m, load_catalog(), settings()))]
    pods = [
        pool_pod("a-1", "a", **{SERVES_TENANT_LABEL: "other"}),
        pool_pod("a-2", "a", **{SERVES_TENANT_LABEL: "t"}),
        pool_pod("a-3", "a"),
        pool_pod("a-4", "a"),
    ]
    # This process's knowledge comes before the label written behind it.
    pinned = {str(pods[3]["metadata"]["uid"]): "other"}
    names = [p["metadata"]["name"] for p in candidates(pods, pools, "t", pinned)]
    assert names == ["a-2", "a-3"]


def test_the_claim_is_conditional_and_hands_the_pod_to_the_execution() -> None:
    pod = pool_pod("a-1", "a")
    execution = {
        "apiVersion": "sandpod.dev/v1alpha1",
        "kind": "CodeExecution",
        "metadata": {"name": "hello", "namespace": NAMESPACE, "uid": "u-1"},
    }
    patch = claim_patch(pod, execution, EXECUTION_LABEL)["metadata"]
    assert patch["resourceVersion"] == pod["metadata"]["resourceVersion"]
    assert patch["labels"] == {
        POOL_STATE_LABEL: POOL_CLAIMED,
        CLAIMED_BY_LABEL: "u-1",
        EXECUTION_LABEL: "hello",
    }
    (owner,) = patch["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("CodeExecution", "u-1", True)


def test_the_run_request_carries_the_config_and_the_inputs() -> None:
    spec = spec_of(stdin="x", files=[{"path": "data/a.txt", "content": "a"}], args=["-v"])
    plan = plan_execution(spec, load_catalog(), settings())
    body = run_request("u-1", spec, plan, settings())
    assert body["executionId"] == "u-1"
    assert (body["source"], body["stdin"]) == ("print(1)", "x")
    assert body["files"] == [{"path": "data/a.txt", "content": "a"}]
    assert body["config"]["args"] == ["-v"]
    assert body["config"]["timeoutSeconds"] == spec.timeout_seconds


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b'{"serve":{"port":7070,"credential":"' + b"ab" * 32 + b'"}}\nlater', "ab" * 32),
        (b'{"serve":{"port":7070,"credential":"' + b"ab" * 32 + b'"}}', None),
        (b'{"serve":{"credential":"AB"}}\n', None),
        (b'{"seq":1}\n', None),
        (b"not json\n", None),
        (b"", None),
    ],
)
def test_only_a_whole_first_line_with_a_credential_gives_one(
    head: bytes, expected: str | None
) -> None:
    assert parse_credential(head) == expected


def test_the_fakes_label_selector() -> None:
    labels = {"a": "1", "b": "2"}
    assert selects("a", labels) and selects("a=1,b=2", labels)
    assert not selects("c", labels) and not selects("a=2", labels)


# --- the runner client against a local serve-protocol server --------------------------------


# Function-scoped loops: the servers must run on the loop of the test that uses them.
@pytest_asyncio.fixture(loop_scope="function")
async def served() -> AsyncIterator[ServeDouble]:
    server = await ServeDouble().start()
    yield server
    await server.stop()


async def ask(server: ServeDouble, credential: str | None = None, uid: str = "u-1") -> Any:
    async with aiohttp.ClientSession() as session:
        return await run(
            session,
            RunnerAddress("127.0.0.1", server.port),
            credential or server.credential,
            {"executionId": uid},
            tail_bytes=TAIL,
            limit_bytes=LIMIT,
        )


async def test_the_client_returns_the_verified_output_and_result(served: ServeDouble) -> None:
    served.script = Script(outputs=[("stdout", "hi\n"), ("stderr", "warn\n")])
    log = await ask(served)
    assert (log.stdout, log.stderr, log.dropped_lines, log.missing_frames) == (
        "hi\n",
        "warn\n",
        0,
        0,
    )
    assert log.result is not None and log.result.exit_code == 0


async def test_forged_and_unsigned_frames_are_dropped(served: ServeDouble) -> None:
    served.script = Script(outputs=[("stdout", "one\n"), ("stdout", "two\n")], forged=True)
    log = await ask(served)
    assert (log.stdout, log.dropped_lines) == ("one\ntwo\n", 2)


async def test_a_wrong_credential_or_another_execution_is_refused(served: ServeDouble) -> None:
    with pytest.raises(RunnerUnavailable, match="401"):
        await ask(served, credential="00" * 32)
    await ask(served, uid="u-1")
    with pytest.raises(RunnerUnavailable, match="410"):
        await ask(served, uid="u-2")
    assert served.runs == 1


async def test_a_second_post_with_the_same_id_replays_the_run(served: ServeDouble) -> None:
    first, second = await ask(served), await ask(served)
    assert first == second and served.runs == 1 and len(served.requests) == 2


async def test_a_runner_gone_mid_answer_is_unavailable(served: ServeDouble) -> None:
    served.script = Script(outputs=[("stdout", "a\n"), ("stdout", "b\n")], gone_after_frames=1)
    with pytest.raises(RunnerUnavailable):
        await ask(served)


async def test_nothing_listening_is_unavailable() -> None:
    server = await ServeDouble().start()
    await server.stop()
    with pytest.raises(RunnerUnavailable):
        await ask(server)


# --- the Reconciler's warm path -------------------------------------------------------------


def new_reconciler(kube: FakeKube, **overrides: Any) -> Reconciler:
    """A fresh operator process."""
    return Reconciler(
        kube=kube,
        settings=settings(**overrides),
        catalog=load_catalog(),
        post_event=kube.post_event,
        pools_in=lambda namespace: [pool()],
    )


@pytest_asyncio.fixture(loop_scope="function")
async def runners() -> AsyncIterator[list[ServeDouble]]:
    started: list[ServeDouble] = []
    yield started
    for server in started:
        await server.stop()


async def pool_with(
    kube: FakeKube,
    runners: list[ServeDouble],
    *scripts: Script,
    name: str = "py",
    many: bool = False,
) -> list[ServeDouble]:
    """A pool whose free ready pods each run a local serve-protocol server (`many`: one that
    serves many runs, as a boxed sandbox's runner does)."""
    servers = []
    for index, script in enumerate(scripts):
        server = await ServeDouble(script, many=many).start()
        runners.append(server)
        servers.append(server)
        kube.add_pool_pod(
            NAMESPACE,
            f"{name}-{index}",
            pool=name,
            port=server.port,
            credential=server.credential,
        )
    return servers


async def start(reconciler: Reconciler, kube: FakeKube, name: str = "hello") -> None:
    await reconciler.start(latest(kube, name), deny_all_present=True, pools=[pool()])


async def warm_run(
    kube: FakeKube, runners: list[ServeDouble], script: Script, **spec: Any
) -> Manifest:
    """One execution through a pool of one pod whose runner follows `script`: its status."""
    await pool_with(kube, runners, script)
    reconciler = new_reconciler(kube, deadline_grace_seconds=0)
    submit(kube, **spec)
    await start(reconciler, kube)
    await asyncio.wait_for(reconciler.run_warm(latest(kube)), timeout=10)
    await reconciler.close()
    return status_of(kube)


async def test_a_warm_run_takes_a_pod_records_the_runners_result_and_removes_a_spent_pod(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    (server,) = await pool_with(kube, runners, Script(outputs=[("stdout", "hi\n")]))
    reconciler = new_reconciler(kube)
    submit(kube)
    await start(reconciler, kube)
    status = status_of(kube)
    assert (status["phase"], status["startMode"], status["podName"]) == ("Running", "warm", "py-0")
    assert status["waitMs"] >= 0
    labels = kube.pods[(NAMESPACE, "py-0")]["metadata"]["labels"]
    # Written before its first run, so that a restarted operator hands it to no one else.
    assert (labels[SERVES_TENANT_LABEL], labels[POOL_STATE_LABEL]) == ("", POOL_FREE)
    await reconciler.run_warm(latest(kube))
    status = status_of(kube)
    assert (status["phase"], status["reason"], status["stdout"]) == (
        "Succeeded",
        "Completed",
        "hi\n",
    )
    assert status["startMode"] == "warm" and status["exitCode"] == 0
    assert status["reportedBy"] == "runner"
    assert (NAMESPACE, "py-0") not in kube.pods
    assert server.runs == 1 and server.requests[0]["source"] == "print('hi')"
    assert not [kind for kind, _ in kube.created if kind == "Pod"]


async def test_two_executions_racing_for_one_pod_one_warm_one_cold(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    await pool_with(kube, runners, Script())
    reconciler = new_reconciler(kube)
    submit(kube, "one")
    submit(kube, "two")
    await asyncio.gather(start(reconciler, kube, "one"), start(reconciler, kube, "two"))
    modes = sorted(status_of(kube, name)["startMode"] for name in ("one", "two"))
    assert modes == ["cold", "warm"]
    await asyncio.gather(*reconciler.warm_runs.values())
    # The pod served one run: the other waited for it, then found it spent.
    assert (NAMESPACE, "py-0") not in kube.pods
    await reconciler.close()


async def test_a_pod_whose_status_write_failed_is_left_to_the_next_try(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    await pool_with(kube, runners, Script(), Script())
    submit(kube)
    kube.fail("patch_execution_status", KubeError(500, "InternalError", "etcd hiccup"))
    with pytest.raises(KubeError):
        await start(new_reconciler(kube), kube)
    assert "podName" not in status_of(kube)
    await start(new_reconciler(kube), kube)
    assert status_of(kube)["podName"] == "py-0"
    labels = kube.pods[(NAMESPACE, "py-1")]["metadata"]["labels"]
    assert labels[POOL_STATE_LABEL] == "free"
    assert kube.calls.count("patch_pod") == 1


@pytest.mark.parametrize("drained", ["no pods", "none ready", "all claimed"])
async def test_a_drained_pool_falls_back_to_cold(
    kube: FakeKube, runners: list[ServeDouble], drained: str
) -> None:
    if drained != "no pods":
        await pool_with(kube, runners, Script())
        pod = kube.pods[(NAMESPACE, "py-0")]
        if drained == "none ready":
            pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        else:
            pod["metadata"]["labels"][POOL_STATE_LABEL] = POOL_CLAIMED
    submit(kube)
    await start(new_reconciler(kube), kube)
    status = status_of(kube)
    assert (status["phase"], status["startMode"]) == ("Pending", "cold")
    assert status["podName"] != "py-0"


async def test_an_execution_beyond_the_pools_resources_goes_cold(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    (server,) = await pool_with(kube, runners, Script())
    submit(kube, resources={"memory": "1Gi"})
    await start(new_reconciler(kube), kube)
    assert status_of(kube)["startMode"] == "cold"
    assert kube.pods[(NAMESPACE, "py-0")]["metadata"]["labels"][POOL_STATE_LABEL] == "free"
    assert server.runs == 0


async def test_after_a_restart_the_run_is_re_attached_not_run_again(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    hold = asyncio.Event()
    (server,) = await pool_with(kube, runners, Script(hold=hold))
    submit(kube)
    first = new_reconciler(kube)
    await start(first, kube)
    serving = asyncio.create_task(first.run_warm(latest(kube)))
    while not server.requests:
        await asyncio.sleep(0.01)
    serving.cancel()  # the operator process dies mid-run: its daemon and its run task
    for task in first.warm_runs.values():
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
    second = new_reconciler(kube)
    await start(second, kube)  # on.resume: the status says warm, nothing to start
    resumed = asyncio.create_task(second.run_warm(latest(kube)))
    while len(server.requests) < 2:
        await asyncio.sleep(0.01)
    hold.set()
    await resumed
    assert status_of(kube)["phase"] == "Succeeded"
    assert server.runs == 1 and server.answered >= 1
    assert [r["executionId"] for r in server.requests] == [latest(kube)["metadata"]["uid"]] * 2
    await first.close()
    await second.close()


async def test_a_runner_gone_mid_run_ends_in_error_and_nothing_runs_again(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    script = Script(outputs=[("stdout", "a\n"), ("stdout", "b\n")], gone_after_frames=1)
    (server, spare) = await pool_with(kube, runners, script, Script())
    reconciler = new_reconciler(kube)
    submit(kube)
    await start(reconciler, kube)
    await reconciler.run_warm(latest(kube))
    status = status_of(kube)
    assert (status["phase"], status["reason"], status["retryable"]) == (
        "Error",
        "RunnerUnavailable",
        True,
    )
    assert "a\n" not in status.get("message", "")
    await start(reconciler, kube)
    await reconciler.run_warm(latest(kube))
    assert (NAMESPACE, "py-0") not in kube.pods
    assert (spare.runs, len(server.requests)) == (0, 1)
    assert not [kind for kind, _ in kube.created if kind == "Pod"]


@pytest.mark.parametrize("refusal", ["wrong credential", "claimed by another"])
async def test_a_runner_that_refuses_ends_in_error(
    kube: FakeKube, runners: list[ServeDouble], refusal: str
) -> None:
    (server,) = await pool_with(kube, runners, Script())
    if refusal == "wrong credential":
        server.credential = "ff" * 32
    else:
        server.execution_id = "someone-else"
    reconciler = new_reconciler(kube)
    submit(kube)
    await start(reconciler, kube)
    await reconciler.run_warm(latest(kube))
    assert (status_of(kube)["phase"], status_of(kube)["reason"]) == ("Error", "RunnerUnavailable")
    if refusal == "wrong credential":
        assert server.runs == 0
    else:
        assert server.execution_id == "someone-else"


async def test_forged_frames_never_reach_the_status(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    status = await warm_run(kube, runners, Script(outputs=[("stdout", "real\n")], forged=True))
    assert (status["phase"], status["stdout"]) == ("Succeeded", "real\n")


async def test_the_operators_deadline_ends_a_run_that_does_not_answer(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    status = await warm_run(kube, runners, Script(hold=asyncio.Event()), timeoutSeconds=1)
    assert (status["phase"], status["reason"]) == ("TimedOut", "DeadlineExceeded")
    assert (NAMESPACE, "py-0") not in kube.pods


async def test_a_non_zero_exit_comes_from_the_runners_summary(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    status = await warm_run(kube, runners, Script(result=runner_wire.result(exitCode=3)))
    assert (status["phase"], status["exitCode"]) == ("Failed", 3)


async def test_pool_pod_events_read_the_credential_once_and_never_follow_the_pod(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    (server,) = await pool_with(kube, runners, Script())
    reconciler = new_reconciler(kube)
    pod = copy.deepcopy(kube.pods[(NAMESPACE, "py-0")])
    await reconciler.on_pod_event("MODIFIED", pod)
    await reconciler.on_pod_event("MODIFIED", pod)
    assert reconciler.warm.credentials == {pod["metadata"]["uid"]: server.credential}
    assert kube.calls.count("read_log_head") == 1
    await reconciler.on_pod_event("DELETED", pod)
    assert reconciler.warm.credentials == {}
    assert "get_execution" not in kube.calls


async def test_the_watchdog_ends_a_warm_run_left_past_its_deadline(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    await pool_with(kube, runners, Script(hold=asyncio.Event()))
    reconciler = new_reconciler(kube)
    submit(kube, timeoutSeconds=1)
    await start(reconciler, kube)
    await reconciler.watch(latest(kube), [])
    assert status_of(kube)["phase"] == "Running"
    long_ago = "2020-01-01T00:00:00Z"
    kube.write_status(NAMESPACE, "hello", {"startedAt": long_ago})
    await reconciler.watch(latest(kube), [])
    assert (status_of(kube)["phase"], status_of(kube)["reason"]) == ("TimedOut", "DeadlineExceeded")
    assert (NAMESPACE, "py-0") not in kube.pods


async def test_the_claim_starts_the_run_at_once_and_the_daemon_only_waits_for_it(
    kube: FakeKube, runners: list[ServeDouble], caplog: pytest.LogCaptureFixture
) -> None:
    (server,) = await pool_with(kube, runners, Script(outputs=[("stdout", "hi\n")]))
    reconciler = new_reconciler(kube)
    submit(kube)
    await start(reconciler, kube)
    running = latest(kube)  # the body kopf's serve daemon starts with
    uid = running["metadata"]["uid"]
    caplog.set_level("INFO", logger="sandpod_operator.pools.warm")
    await asyncio.wait_for(reconciler.warm_runs[uid], timeout=10)
    assert (status_of(kube)["phase"], status_of(kube)["stdout"]) == ("Succeeded", "hi\n")
    calls = len(kube.calls)
    await reconciler.run_warm(running)  # the daemon, spawned on the Running event
    await start(reconciler, kube)  # on.create again (a retry): nothing to claim
    assert len(kube.calls) == calls and server.runs == 1 and len(server.requests) == 1
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith(TIMINGS_LOG)]
    marks = json.loads(line.split(" ", 3)[3])
    order = ["claiming", "claimed", "running", "posted", "answered", "first_frame", "summary"]
    assert [name for name in marks if name in order] == order
    assert list(marks.values()) == sorted(marks.values())
    reconciler.forget(uid)
    assert uid not in reconciler.warm_done
    await reconciler.close()


async def pool_and_execution(
    kube: FakeKube, runners: list[ServeDouble]
) -> tuple[ServeDouble, Reconciler]:
    """A pool of one pod, a reconciler and an execution it may claim that pod for."""
    (server,) = await pool_with(kube, runners, Script())
    reconciler = new_reconciler(kube)
    submit(kube)
    return server, reconciler


async def test_a_run_that_could_not_record_is_recorded_by_the_daemon_never_rerun(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    server, reconciler = await pool_and_execution(kube, runners)
    await start(reconciler, kube)
    running = latest(kube)
    kube.fail("patch_execution_status", KubeError(500, "InternalError", "etcd hiccup"))
    await reconciler.run_warm(running)  # the task failed to record: the daemon records
    assert status_of(kube)["phase"] == "Succeeded"
    assert server.runs == 1 and len(server.requests) == 1
    assert (NAMESPACE, "py-0") not in kube.pods  # it said retiring: gone before the record
    await reconciler.close()


def pool_pods(kube: FakeKube) -> list[Manifest]:
    """The operator's index of pool pods, as last seen."""
    return [copy.deepcopy(pod) for pod in kube.pods.values()]


async def two_held_pods(
    kube: FakeKube, runners: list[ServeDouble]
) -> tuple[Reconciler, list[Manifest]]:
    """A pool of two pods whose runs never end, an execution, and the index of the pods."""
    await pool_with(kube, runners, Script(hold=asyncio.Event()), Script(hold=asyncio.Event()))
    submit(kube)
    return new_reconciler(kube), pool_pods(kube)


async def test_the_first_event_claims_from_the_index_before_the_create_handler(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    server, reconciler = await pool_and_execution(kube, runners)
    for pod in pool_pods(kube):
        await reconciler.warm.pool_pod_changed("ADDED", pod)  # its credential, once ready
    await reconciler.start_early(latest(kube), pools=[pool()], pool_pods=pool_pods(kube))
    assert "list_pods" not in kube.calls
    assert (status_of(kube)["startMode"], status_of(kube)["podName"]) == ("warm", "py-0")
    uid = latest(kube)["metadata"]["uid"]
    await asyncio.wait_for(reconciler.warm_runs[uid], timeout=10)
    calls = len(kube.calls)
    await start(reconciler, kube)  # on.create, once kopf's finalizer is on
    await reconciler.start_early(latest(kube), pools=[pool()], pool_pods=pool_pods(kube))
    assert len(kube.calls) == calls and server.runs == 1
    assert status_of(kube)["phase"] == "Succeeded"
    await reconciler.close()


async def test_after_a_restart_a_pod_whose_run_is_not_re_attached_takes_no_other(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    """A run recorded on py-0 that this process has not re-attached to yet: another run would
    push its records out of py-0's runner, so py-0 waits until its run is re-attached."""
    reconciler, index = await two_held_pods(kube, runners)
    for pod in index:
        await reconciler.warm.pool_pod_changed("ADDED", pod)
    recorded = {(NAMESPACE, "py-0"): ["uid-of-a-run-before-the-restart"]}
    reconciler.warm.runs_recorded_on = lambda namespace, pod: recorded.get((namespace, pod), [])
    await reconciler.start(latest(kube), deny_all_present=True, pools=[pool()], pool_pods=index)
    assert status_of(kube)["podName"] == "py-1"
    reconciler.warm.reserve_for_reattach(index[0], "uid-of-a-run-before-the-restart")
    reconciler.warm.release(index[0], serves_on=True)
    catalog, spec = load_catalog(), spec_of()
    wanted = execution_wants(spec, plan_execution(spec, catalog, reconciler.settings))
    assert reconciler.warm.reserve(wanted, [pool()], index, "") == index[0]
    await reconciler.close()


async def test_a_pod_whose_tenant_label_cannot_be_written_is_not_run_in(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    (server,) = await pool_with(kube, runners, Script())
    reconciler = new_reconciler(kube)
    submit(kube)
    kube.fail("patch_pod", TimeoutError("the answer was lost"))
    await start(reconciler, kube)
    assert status_of(kube)["startMode"] == "cold" and server.runs == 0
    assert not reconciler.warm.reserved  # left for the next run
    await reconciler.close()


async def test_a_pool_pod_serves_one_tenants_record_path_runs_and_stays(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    (server,) = await pool_with(kube, runners, Script(), many=True)
    reconciler = new_reconciler(kube)
    for name in ("one", "two"):
        submit(kube, name)
        await start(reconciler, kube, name)
        await asyncio.gather(*reconciler.warm_runs.values())
    assert [status_of(kube, n)["phase"] for n in ("one", "two")] == ["Succeeded"] * 2
    assert [status_of(kube, n)["podName"] for n in ("one", "two")] == ["py-0"] * 2
    assert server.runs == 2 and (NAMESPACE, "py-0") in kube.pods
    await reconciler.close()


async def test_a_run_refused_by_a_retired_runner_runs_in_another_pod(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    (retired, fresh) = await pool_with(kube, runners, Script(), Script(), many=True)
    retired.max_runs = 0  # past its age: it takes no run
    reconciler = new_reconciler(kube)
    submit(kube)
    await start(reconciler, kube)
    await asyncio.gather(*reconciler.warm_runs.values())
    status = status_of(kube)
    assert (status["phase"], status["podName"]) == ("Succeeded", "py-1")
    assert (retired.runs, fresh.runs) == (0, 1)
    assert (NAMESPACE, "py-0") not in kube.pods  # replaced by its pool
    await reconciler.close()


async def test_a_cancel_stops_the_run_on_its_runner_and_the_pod_serves_on(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    (server,) = await pool_with(kube, runners, Script(hold=asyncio.Event()), many=True)
    reconciler = new_reconciler(kube)
    submit(kube)
    await start(reconciler, kube)
    while server.running is None:
        await asyncio.sleep(0.01)
    await reconciler.cancel(latest(kube))
    await asyncio.gather(*reconciler.warm_runs.values())
    assert status_of(kube)["phase"] == "Cancelled"
    assert server.cancelled == {latest(kube)["metadata"]["uid"]}
    assert (NAMESPACE, "py-0") in kube.pods and not reconciler.warm.reserved
    await reconciler.close()


# --- the direct path's pool runs -------------------------------------------------------------


async def test_a_direct_pool_run_is_answered_by_the_runner_and_recorded_behind(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    (server,) = await pool_with(kube, runners, Script(outputs=[("stdout", "hi\n")]))
    reconciler = new_reconciler(kube)
    pod = copy.deepcopy(kube.pods[(NAMESPACE, "py-0")])
    await reconciler.warm.pool_pod_changed("ADDED", pod)  # its credential, read once ready
    runs = DirectRuns(reconciler.sessions, kube, reconciler.store_outputs)
    one_off = {"metadata": {"name": "direct-1"}, "spec": {"language": "python", "source": "1"}}

    record = await runs.run_from_pool(NAMESPACE, one_off, [pool()], [pod])
    again = await runs.run_from_pool(NAMESPACE, one_off, [pool()], [pod])
    await asyncio.gather(*runs.writers)

    assert (record["status"]["phase"], record["status"]["stdout"]) == ("Succeeded", "hi\n")
    assert (record["status"]["startMode"], record["status"]["podName"]) == ("warm", "py-0")
    assert again == record and server.runs == 1
    assert status_of(kube, "direct-1")["phase"] == "Succeeded"
    assert (NAMESPACE, "py-0") not in kube.pods  # it said retiring: deleted behind
    with pytest.raises(NotServing):
        await runs.run_from_pool(
            NAMESPACE, {**one_off, "metadata": {"name": "direct-2"}}, [pool()], [pod]
        )
    await reconciler.close()


async def test_a_direct_run_logs_its_milestones_once_and_keeps_none_when_refused(
    kube: FakeKube, runners: list[ServeDouble], caplog: pytest.LogCaptureFixture
) -> None:
    await pool_with(kube, runners, Script(outputs=[("stdout", "hi\n")]))
    reconciler = new_reconciler(kube)
    pod = copy.deepcopy(kube.pods[(NAMESPACE, "py-0")])
    await reconciler.warm.pool_pod_changed("ADDED", pod)
    runs = DirectRuns(reconciler.sessions, kube, reconciler.store_outputs)
    one_off = {"metadata": {"name": "direct-1"}, "spec": {"language": "python", "source": "1"}}
    caplog.set_level("INFO", logger="sandpod_operator.pools.warm")

    await runs.run_from_pool(NAMESPACE, one_off, [pool()], [pod])
    with pytest.raises(NotServing):  # no free pod left
        await runs.run_from_pool(
            NAMESPACE, {**one_off, "metadata": {"name": "direct-2"}}, [pool()], [pod]
        )
    await asyncio.gather(*runs.writers)

    assert_only_direct_1_logged_its_milestones(caplog)
    assert reconciler.warm.marks == {}
    await reconciler.close()


def assert_only_direct_1_logged_its_milestones(caplog: pytest.LogCaptureFixture) -> None:
    """One timings line, direct-1's, with every milestone of a direct run in order."""
    messages = [r.getMessage() for r in caplog.records]
    (line,) = [message for message in messages if message.startswith(DIRECT_TIMINGS_LOG)]
    assert line.split(" ")[2] == f"{NAMESPACE}/direct-1"
    marks = json.loads(line.split(" ", 3)[3])
    order = ["received", "turn", "posted", "answered", "first_frame", "summary", "done"]
    assert list(marks) == order
    assert list(marks.values()) == sorted(marks.values())


async def test_a_pod_the_direct_path_took_is_not_claimed_by_the_record_path(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    await pool_with(kube, runners, Script())
    reconciler = new_reconciler(kube)
    pod = copy.deepcopy(kube.pods[(NAMESPACE, "py-0")])
    await reconciler.warm.pool_pod_changed("ADDED", pod)
    catalog, spec = load_catalog(), spec_of()
    wanted = execution_wants(spec, plan_execution(spec, catalog, reconciler.settings))

    taken = reconciler.warm.reserve(wanted, [pool()], [pod], "")
    submit(kube)
    await start(reconciler, kube)

    assert taken is not None and taken["metadata"]["name"] == "py-0"
    assert reconciler.warm.reserve(wanted, [pool()], [pod], "") is None
    assert status_of(kube)["startMode"] == "cold"
    await reconciler.close()


def one_off_of(name: str, tenant: str) -> Manifest:
    return {
        "metadata": {"name": name, "labels": {TENANT_LABEL: tenant}},
        "spec": {"language": "python", "source": "1"},
    }


async def test_a_pool_pod_serves_its_tenants_runs_one_after_another(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    (server,) = await pool_with(kube, runners, Script(outputs=[("stdout", "hi\n")]), many=True)
    reconciler = new_reconciler(kube)
    pod = copy.deepcopy(kube.pods[(NAMESPACE, "py-0")])
    await reconciler.warm.pool_pod_changed("ADDED", pod)
    runs = DirectRuns(reconciler.sessions, kube, reconciler.store_outputs)

    first = await runs.run_from_pool(NAMESPACE, one_off_of("run-1", "a"), [pool()], [pod])
    second = await runs.run_from_pool(NAMESPACE, one_off_of("run-2", "a"), [pool()], [pod])
    with pytest.raises(NotServing):  # never another tenant's
        await runs.run_from_pool(NAMESPACE, one_off_of("run-3", "b"), [pool()], [pod])
    await asyncio.gather(*runs.writers)

    assert [r["status"]["podName"] for r in (first, second)] == ["py-0", "py-0"]
    assert server.executions == [f"{NAMESPACE}/run-1", f"{NAMESPACE}/run-2"]
    labels = kube.pods[(NAMESPACE, "py-0")]["metadata"]["labels"]
    assert labels[SERVES_TENANT_LABEL] == "a" and labels[POOL_STATE_LABEL] == POOL_FREE
    await reconciler.close()


async def test_runs_take_the_pod_that_rested_longest(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    """The runner of the pod released longest ago has had the most time to prepare its next
    box, so one after another the runs go round the pool's pods."""
    await pool_with(kube, runners, Script(), Script(), many=True)
    reconciler = new_reconciler(kube)
    pods = pool_pods(kube)
    for pod in pods:
        await reconciler.warm.pool_pod_changed("ADDED", pod)
    runs = DirectRuns(reconciler.sessions, kube, reconciler.store_outputs)

    served = [
        (await runs.run_from_pool(NAMESPACE, one_off_of(f"run-{n}", "a"), [pool()], pods))[
            "status"
        ]["podName"]
        for n in range(3)
    ]
    await asyncio.gather(*runs.writers)

    assert served == ["py-0", "py-1", "py-0"]
    await reconciler.close()


async def test_a_run_waits_for_its_tenants_busy_pod_rather_than_going_cold(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    held = asyncio.Event()
    await pool_with(kube, runners, Script(hold=held), many=True)
    reconciler = new_reconciler(kube)
    pod = copy.deepcopy(kube.pods[(NAMESPACE, "py-0")])
    await reconciler.warm.pool_pod_changed("ADDED", pod)
    runs = DirectRuns(reconciler.sessions, kube, reconciler.store_outputs)

    first = asyncio.ensure_future(
        runs.run_from_pool(NAMESPACE, one_off_of("run-1", "a"), [pool()], [pod])
    )
    while not reconciler.warm.reserved:
        await asyncio.sleep(0)
    second = asyncio.ensure_future(
        runs.run_from_pool(NAMESPACE, one_off_of("run-2", "a"), [pool()], [pod])
    )
    held.set()
    records = await asyncio.gather(first, second)
    await asyncio.gather(*runs.writers)

    assert [r["status"]["phase"] for r in records] == ["Succeeded", "Succeeded"]
    await reconciler.close()


async def test_a_record_changed_since_its_creation_still_gets_its_status(kube: FakeKube) -> None:
    reconciler = new_reconciler(kube)
    runs = DirectRuns(reconciler.sessions, kube, reconciler.store_outputs)
    created = submit(kube, "direct-1")
    stored = kube.executions[(NAMESPACE, "direct-1")]
    stored["metadata"]["annotations"] = {"sandpod.dev/cancel": "true"}  # the gateway's DELETE
    kube._bump(stored)

    await runs._write_status(created, {"phase": "Cancelled"})

    assert status_of(kube, "direct-1") == {"phase": "Cancelled"}
    await reconciler.close()

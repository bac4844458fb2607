"""CodeSessions against the in-memory API server and a real local runner in session mode:
the session's pod (own or claimed from a session pool), its executions in creation order one
at a time, the trailing value and lost state, idle and lifetime ends, deletion, unknown and
ended sessions, an operator restart in the middle of the queue, and host entries (the
session's own proxy grant, each run's refusals from the proxy's monitor)."""

import asyncio
import copy
import json
import threading
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kopf
import pytest
import pytest_asyncio
import runner_wire
from fake_kube import FakeKube, Key, Manifest, ready_status, stamp
from sandpod_contract.catalog import load_catalog
from sandpod_contract.egress_grant import HostGrant, verify
from sandpod_contract.models import MAX_TIMEOUT_SECONDS, CodeSessionSpec
from sandpod_contract.names import (
    CLAIMED_BY_LABEL,
    POOL_CLAIMED,
    POOL_STATE_LABEL,
    SESSION_END_ANNOTATION,
    SESSION_LABEL,
)
from sandpod_operator.egress.proxy import blocked_between
from sandpod_operator.executions.reconciler import Reconciler
from sandpod_operator.kube import KubeError
from sandpod_operator.serving.core import NotServing
from sandpod_operator.serving.direct import DirectRuns
from sandpod_operator.sessions.controller import (
    DEADLINE_SLACK_SECONDS,
    SESSION_ENDED_MESSAGE,
    SESSION_NOT_FOUND_MESSAGE,
    deadlines,
    end_requested,
    expiry_reason,
    queue_order,
)
from sandpod_operator.settings import CONFIG_KEY, OperatorSettings
from sandpod_proxy.monitor import Tally, handler_for
from serve_double import Script, ServeDouble
from test_operator_reconciler import latest, status_of, submit

# runners: the local runners a test started, stopped after it.
from test_operator_warm import assert_only_direct_1_logged_its_milestones, runners

__all__ = ["runners"]

pytestmark = pytest.mark.usefixtures("clean_environment")

NAMESPACE = "team-a"
SESSION = "notebook"


def new_reconciler(kube: FakeKube) -> Reconciler:
    """A fresh operator process."""
    settings = OperatorSettings(deadline_grace_seconds=0.5)
    return Reconciler(
        kube=kube, settings=settings, catalog=load_catalog(), post_event=kube.post_event
    )


def open_session(kube: FakeKube, **spec: Any) -> Manifest:
    body = {
        "apiVersion": "sandpod.dev/v1alpha1",
        "kind": "CodeSession",
        "metadata": {"name": SESSION, "namespace": NAMESPACE},
        "spec": {"language": "python", **spec},
    }
    return kube.add_session(body)


def session_now(kube: FakeKube) -> Manifest:
    return copy.deepcopy(kube.sessions[(NAMESPACE, SESSION)])


def session_status(kube: FakeKube) -> Manifest:
    return dict(session_now(kube).get("status") or {})


def in_session(kube: FakeKube) -> list[Manifest]:
    """The daemon's queue as the index holds it: every execution naming the session."""
    return [
        copy.deepcopy(e)
        for e in kube.executions.values()
        if (e.get("spec") or {}).get("session") == SESSION
    ]


def ask(kube: FakeKube, name: str, created: datetime, source: str = "print('hi')") -> Manifest:
    """A user creates an execution in the session at `created`."""
    execution = submit(kube, name, source=source, session=SESSION)
    kube.executions[(NAMESPACE, name)]["metadata"]["creationTimestamp"] = stamp(created)
    return execution


def serve_from(kube: FakeKube, key: Key, server: ServeDouble) -> None:
    """The kubelet starts the pod and its runner (the local server) becomes ready."""
    pod = kube.pods[key]
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = server.port
    status = ready_status(datetime.now(UTC), image="python")
    status["podIP"] = "127.0.0.1"
    kube.set_pod_status(*key, status)
    kube.logs[key] = b'{"serve":{"port":7070,"credential":"' + server.credential.encode() + b'"}}\n'


@pytest_asyncio.fixture(loop_scope="function")
async def reconciler(kube: FakeKube) -> AsyncIterator[Reconciler]:
    process = new_reconciler(kube)
    yield process
    await process.close()


async def ready_session(
    kube: FakeKube,
    reconciler: Reconciler,
    runners: list[ServeDouble],
    *scripts: Script,
    **spec: Any,
) -> ServeDouble:
    """A session whose own pod runs a local runner in session mode, Ready."""
    open_session(kube, **spec)
    await reconciler.sessions.start(session_now(kube), pools=[], deny_all=True)
    server = await ServeDouble(session=True, scripts=list(scripts)).start()
    runners.append(server)
    serve_from(kube, (NAMESPACE, session_status(kube)["podName"]), server)
    await reconciler.sessions.tick(session_now(kube), [])
    assert session_status(kube)["phase"] == "Ready"
    return server


async def accept(reconciler: Reconciler, kube: FakeKube, name: str) -> None:
    """The execution's create handler."""
    await reconciler.start(latest(kube, name), deny_all_present=True, session=session_now(kube))


async def drain(reconciler: Reconciler, kube: FakeKube) -> None:
    """The session's daemon, until its queue is empty."""
    for _ in range(20):
        if not queue_order(in_session(kube)):
            return
        await asyncio.wait_for(reconciler.sessions.tick(session_now(kube), in_session(kube)), 10)
    raise AssertionError("the queue did not drain")


def session_pool() -> list[Manifest]:
    """A pool of session pods (python, 1 pod) that fits a session without network."""
    return [
        {
            "metadata": {"name": "warm", "namespace": NAMESPACE},
            "spec": {"language": "python", "size": 1, "sessions": True},
        }
    ]


async def free_pool_pod(kube: FakeKube, runners: list[ServeDouble]) -> ServeDouble:
    """A free ready pod warm-0 of session_pool(), its runner a local one in session mode."""
    server = await ServeDouble(session=True).start()
    runners.append(server)
    kube.add_pool_pod(
        NAMESPACE, "warm-0", pool="warm", port=server.port, credential=server.credential
    )
    return server


def ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


def uid_of(kube: FakeKube, name: str) -> str:
    return str(kube.executions[(NAMESPACE, name)]["metadata"]["uid"])


def terminal_events(kube: FakeKube, name: str) -> list[str]:
    ends = {"Succeeded", "Failed", "TimedOut", "Error", "Cancelled"}
    return [e.reason for e in kube.events if e.uid == uid_of(kube, name) and e.reason in ends]


# --- pure ---------------------------------------------------------------------------------


def test_the_queue_runs_in_creation_order_then_by_name() -> None:
    def execution(name: str, created: str, phase: str | None = None) -> Manifest:
        status = {"phase": phase} if phase else {}
        return {"metadata": {"name": name, "creationTimestamp": created}, "status": status}

    found = [
        execution("b", "2030-01-01T00:00:02Z"),
        execution("z", "2030-01-01T00:00:01Z"),
        execution("a", "2030-01-01T00:00:02Z"),
        execution("done", "2030-01-01T00:00:00Z", "Succeeded"),
    ]
    assert [e["metadata"]["name"] for e in queue_order(found)] == ["z", "a", "b"]


def test_idle_counts_from_the_last_execution_and_the_lifetime_from_creation() -> None:
    spec = CodeSessionSpec.model_validate(
        {"language": "python", "idleTimeoutSeconds": 10, "maxLifetimeSeconds": 60}
    )
    created = ago(30)
    assert expiry_reason(spec, {"lastActivityAt": stamp(ago(5))}, created, ago(0)) == ""
    assert expiry_reason(spec, {"lastActivityAt": stamp(ago(11))}, created, ago(0)) == (
        "IdleTimeout"
    )
    assert expiry_reason(spec, {"lastActivityAt": stamp(ago(1))}, ago(61), ago(0)) == (
        "LifetimeExceeded"
    )


# --- the session's pod --------------------------------------------------------------------


async def test_a_session_gets_its_own_serving_pod_and_becomes_ready(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    await ready_session(kube, reconciler, runners)
    status = session_status(kube)
    assert (status["startMode"], status["reason"], status["executionCount"]) == (
        "cold",
        "Started",
        0,
    )
    assert status["expiresAt"] and status["startedAt"]
    pod = kube.pods[(NAMESPACE, status["podName"])]
    assert pod["metadata"]["labels"][SESSION_LABEL] == SESSION
    assert pod["spec"]["containers"][0]["command"][-1] == "--session"
    assert "activeDeadlineSeconds" not in pod["spec"]
    (owner,) = pod["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("CodeSession", session_now(kube)["metadata"]["uid"])


async def test_a_session_starts_from_a_session_pool_and_executions_never_take_those(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    server = await free_pool_pod(kube, runners)
    pools = session_pool()
    submit(kube, "one-off")
    await reconciler.start(latest(kube, "one-off"), deny_all_present=True, pools=pools)
    assert status_of(kube, "one-off")["startMode"] == "cold"
    open_session(kube)
    await reconciler.sessions.start(session_now(kube), pools=pools, deny_all=True)
    status = session_status(kube)
    assert (status["podName"], status["startMode"]) == ("warm-0", "warm")
    labels = kube.pods[(NAMESPACE, "warm-0")]["metadata"]["labels"]
    assert labels[POOL_STATE_LABEL] == POOL_CLAIMED and labels[SESSION_LABEL] == SESSION
    assert labels[CLAIMED_BY_LABEL] == session_now(kube)["metadata"]["uid"]
    await reconciler.sessions.tick(session_now(kube), [])
    assert session_status(kube)["phase"] == "Ready"
    ask(kube, "first", ago(1))
    await drain(reconciler, kube)
    assert status_of(kube, "first")["phase"] == "Succeeded" and server.runs == 1


# --- executions in the session ------------------------------------------------------------


async def test_executions_wait_their_turn_then_run_one_at_a_time_in_creation_order(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    scripts = [Script(result=runner_wire.result(value=str(n))) for n in range(3)]
    server = await ready_session(kube, reconciler, runners, *scripts)
    for name, seconds in (("c-first", 3), ("a-second", 2), ("b-third", 2)):
        ask(kube, name, ago(seconds))
        await accept(reconciler, kube, name)
    waiting = status_of(kube, "a-second")
    assert (waiting["phase"], waiting["reason"], waiting["session"]) == (
        "Pending",
        "WaitingForSession",
        SESSION,
    )
    queued = {c["type"]: c for c in waiting["conditions"]}["Queued"]
    assert (queued["status"], queued["reason"]) == ("True", "WaitingForSession")
    await drain(reconciler, kube)
    order = ["c-first", "a-second", "b-third"]
    assert server.executions == [uid_of(kube, name) for name in order]
    assert [status_of(kube, name)["result"] for name in order] == ["0", "1", "2"]
    for name in order:
        status = status_of(kube, name)
        assert (status["phase"], status["podName"]) == (
            "Succeeded",
            session_status(kube)["podName"],
        )
        assert terminal_events(kube, name) == ["Succeeded"]
    assert session_status(kube)["executionCount"] == 3
    assert session_status(kube)["phase"] == "Ready" and session_status(kube)["lastActivityAt"]
    assert (NAMESPACE, session_status(kube)["podName"]) in kube.pods


async def test_a_lost_state_is_reported_and_the_session_goes_on(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    timed_out = Script(result=runner_wire.result(timedOut=True, exitCode=None, signal=9))
    lost = Script(result=runner_wire.result(stateLost=True))
    await ready_session(kube, reconciler, runners, timed_out, lost)
    ask(kube, "slow", ago(2))
    ask(kube, "next", ago(1))
    await drain(reconciler, kube)
    assert status_of(kube, "slow")["phase"] == "TimedOut"
    after = status_of(kube, "next")
    assert (after["phase"], after["stateLost"]) == ("Succeeded", True)
    assert "restarted" in after["message"]
    assert session_status(kube)["phase"] == "Ready"


async def test_an_execution_that_does_not_fit_its_session_is_refused(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    server = await ready_session(kube, reconciler, runners)
    submit(kube, "js", language="javascript", source="1", session=SESSION)
    submit(kube, "big", resources={"memory": "1Gi"}, session=SESSION)
    await accept(reconciler, kube, "js")
    await accept(reconciler, kube, "big")
    assert (status_of(kube, "js")["reason"], status_of(kube, "big")["reason"]) == (
        "InvalidSpec",
        "InvalidSpec",
    )
    assert "'javascript' differs" in status_of(kube, "js")["message"]
    assert status_of(kube, "big")["message"].startswith("spec.resources")
    assert server.runs == 0


async def test_an_unknown_session_and_an_ended_one_refuse_with_fixed_messages(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    submit(kube, "nowhere", session="missing")
    await reconciler.start(latest(kube, "nowhere"), deny_all_present=True)
    status = status_of(kube, "nowhere")
    assert (status["phase"], status["reason"], status["message"]) == (
        "Error",
        "SessionNotFound",
        SESSION_NOT_FOUND_MESSAGE,
    )
    await ready_session(kube, reconciler, runners, idleTimeoutSeconds=10)
    kube.sessions[(NAMESPACE, SESSION)]["status"]["startedAt"] = stamp(ago(11))
    reconciler.sessions.written.clear()
    await reconciler.sessions.tick(session_now(kube), [])
    assert (session_status(kube)["phase"], session_status(kube)["reason"]) == (
        "Ended",
        "IdleTimeout",
    )
    ask(kube, "late", ago(0))
    await accept(reconciler, kube, "late")
    late = status_of(kube, "late")
    assert (late["reason"], late["message"]) == ("SessionEnded", SESSION_ENDED_MESSAGE)


# --- ending -------------------------------------------------------------------------------


async def test_idle_expiry_ends_the_session_and_removes_its_pod(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    await ready_session(kube, reconciler, runners, idleTimeoutSeconds=10)
    pod = session_status(kube)["podName"]
    ask(kube, "one", ago(1))
    await drain(reconciler, kube)
    idle_ends = datetime.fromisoformat(session_status(kube)["lastActivityAt"]) + timedelta(
        seconds=10
    )
    before = datetime.now(UTC)
    wait = await reconciler.sessions.tick(session_now(kube), in_session(kube))
    after = datetime.now(UTC)
    # Until the idle deadline (and the slack), however long the steps took: no bound on time.
    earliest = (idle_ends - after).total_seconds() + DEADLINE_SLACK_SECONDS
    latest_wait = (idle_ends - before).total_seconds() + DEADLINE_SLACK_SECONDS
    assert earliest - 1e-6 <= wait <= latest_wait + 1e-6
    assert session_status(kube)["phase"] == "Ready"
    kube.sessions[(NAMESPACE, SESSION)]["status"]["lastActivityAt"] = stamp(ago(10))
    reconciler.sessions.written.clear()
    await reconciler.sessions.tick(session_now(kube), in_session(kube))
    assert session_status(kube)["reason"] == "IdleTimeout"
    assert (NAMESPACE, pod) not in kube.pods and "expiresAt" not in session_status(kube)


async def test_the_lifetime_ends_the_session_and_its_waiting_executions(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    server = await ready_session(kube, reconciler, runners, maxLifetimeSeconds=60)
    kube.sessions[(NAMESPACE, SESSION)]["metadata"]["creationTimestamp"] = stamp(ago(61))
    reconciler.sessions.written.clear()
    ask(kube, "waiting", ago(0))
    await accept(reconciler, kube, "waiting")
    await reconciler.sessions.tick(session_now(kube), in_session(kube))
    assert session_status(kube)["reason"] == "LifetimeExceeded"
    assert status_of(kube, "waiting")["reason"] == "SessionEnded"
    assert server.runs == 0


async def test_an_end_set_on_the_session_ends_it_before_its_lifetime(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    await ready_session(kube, reconciler, runners, maxLifetimeSeconds=3600)
    metadata = kube.sessions[(NAMESPACE, SESSION)]["metadata"]
    end = ago(-5)
    metadata["annotations"] = {SESSION_END_ANNOTATION: end.isoformat()}
    await reconciler.sessions.tick(session_now(kube), in_session(kube))
    assert session_status(kube)["phase"] == "Ready"
    metadata["annotations"] = {SESSION_END_ANNOTATION: ago(1).isoformat()}
    await reconciler.sessions.tick(session_now(kube), in_session(kube))
    status = session_status(kube)
    assert (status["phase"], status["reason"]) == ("Ended", "LifetimeExceeded")
    assert status["message"].startswith("the session reached the end set for it, ")


def test_an_end_sooner_than_the_lifetime_counts_and_no_other() -> None:
    spec = CodeSessionSpec.model_validate({"language": "python", "maxLifetimeSeconds": 60})
    created, sooner = ago(30), ago(-10)
    assert deadlines(spec, {}, created, sooner)["LifetimeExceeded"] == sooner
    lifetime = created + timedelta(seconds=60)
    assert deadlines(spec, {}, created, ago(-100))["LifetimeExceeded"] == lifetime
    assert end_requested({"metadata": {"annotations": {SESSION_END_ANNOTATION: "soon"}}}) is None
    assert end_requested({"metadata": {}}) is None


async def test_deletion_ends_the_session_its_pod_and_its_queue(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    await ready_session(kube, reconciler, runners)
    pod = session_status(kube)["podName"]
    ask(kube, "waiting", ago(0))
    await reconciler.sessions.end(
        session_now(kube), "Deleted", "the session was deleted", in_session(kube)
    )
    assert (session_status(kube)["phase"], session_status(kube)["reason"]) == ("Ended", "Deleted")
    assert (NAMESPACE, pod) not in kube.pods
    assert status_of(kube, "waiting")["reason"] == "SessionEnded"


async def test_a_lost_pod_ends_the_session(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    await ready_session(kube, reconciler, runners)
    del kube.pods[(NAMESPACE, session_status(kube)["podName"])]
    await reconciler.sessions.tick(session_now(kube), [])
    assert (session_status(kube)["phase"], session_status(kube)["reason"]) == (
        "Ended",
        "SandboxLost",
    )


async def test_a_waiting_execution_whose_session_vanished_ends_at_the_watchdog(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    await ready_session(kube, reconciler, runners)
    ask(kube, "waiting", ago(0))
    await accept(reconciler, kube, "waiting")
    del kube.sessions[(NAMESPACE, SESSION)]
    await reconciler.watch(latest(kube, "waiting"), [], None)
    assert status_of(kube, "waiting")["reason"] == "SessionEnded"


# --- an operator restart mid-queue --------------------------------------------------------


async def test_after_a_restart_mid_queue_each_execution_ends_once_and_in_order(
    kube: FakeKube, runners: list[ServeDouble]
) -> None:
    hold = asyncio.Event()
    first = new_reconciler(kube)
    scripts = [Script(hold=hold), Script(), Script()]
    server = await ready_session(kube, first, runners, *scripts)
    names = ["one", "two", "three"]
    for seconds, name in zip((3, 2, 1), names, strict=True):
        ask(kube, name, ago(seconds))
    daemon = asyncio.create_task(first.sessions.tick(session_now(kube), in_session(kube)))
    while not server.requests:
        await asyncio.sleep(0.01)
    daemon.cancel()  # kill -9 while "one" runs and the others wait
    with pytest.raises(asyncio.CancelledError):
        await daemon
    assert status_of(kube, "one")["phase"] == "Running"
    second = new_reconciler(kube)
    for name in names:  # on.resume of each execution
        await second.start(latest(kube, name), deny_all_present=True, session=session_now(kube))
    resumed = asyncio.create_task(drain(second, kube))
    while len(server.requests) < 2:
        await asyncio.sleep(0.01)
    hold.set()
    await resumed
    assert server.executions == [uid_of(kube, name) for name in names]
    assert [r["executionId"] for r in server.requests][:2] == [uid_of(kube, "one")] * 2
    for name in names:
        assert terminal_events(kube, name) == ["Succeeded"]
    assert session_status(kube)["executionCount"] == 3
    await first.close()
    await second.close()


# --- host entries: the session's own proxy grant ------------------------------------------

PROXY_SERVICE = ("sandpod-system", "egress-proxy")
PROXY_KEY = b"k" * 32
HOSTS = {"egress": "allowlist", "allow": [{"host": "pypi.org"}]}


@pytest.fixture
def monitor() -> Iterator[tuple[Tally, int]]:
    """The proxy's monitor (sandpod_proxy.monitor), on a port of this machine."""
    tally = Tally()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(tally))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield tally, server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest_asyncio.fixture(loop_scope="function")
async def proxied(
    kube: FakeKube, monitor: tuple[Tally, int], tmp_path: Path
) -> AsyncIterator[Reconciler]:
    """An operator with the egress proxy configured: its Service has an address and one
    replica, this machine's monitor."""
    key_file = tmp_path / "proxy-key"
    key_file.write_bytes(PROXY_KEY)
    kube.service_ips[PROXY_SERVICE] = "10.96.0.50"
    kube.endpoints[PROXY_SERVICE] = ["127.0.0.1"]
    settings = OperatorSettings(
        deadline_grace_seconds=0.5,
        egress_proxy_service="/".join(PROXY_SERVICE),
        egress_proxy_key_file=key_file,
        egress_proxy_monitor_port=monitor[1],
        egress_proxy_pod_labels={"app.kubernetes.io/component": "egress-proxy"},
    )
    process = Reconciler(
        kube=kube, settings=settings, catalog=load_catalog(), post_event=kube.post_event
    )
    yield process
    await process.close()


def refuse(tally: Tally, kube: FakeKube, *destinations: str) -> Callable[[], None]:
    """What a program does while it runs: requests the proxy refuses under the session's
    grant (the monitor gets Squid's log lines)."""

    def requests() -> None:
        uid = session_now(kube)["metadata"]["uid"]
        for destination in destinations:
            host, port = destination.split(":")
            tally.record(f"{uid}/{NAMESPACE} {host} {port} TCP_DENIED 403 CONNECT")

    return requests


def test_a_runs_refusals_are_the_growth_of_the_sessions_counts() -> None:
    before = Counter({("a.org", 443): 2, ("b.org", 80): 5})
    after = Counter({("a.org", 443): 5, ("b.org", 80): 1, ("c.org", 80): 1})
    assert [(b.host, b.port, b.count) for b in blocked_between(before, after)] == [
        ("a.org", 443, 3),
        ("c.org", 80, 1),
    ]
    assert blocked_between(after, after) == []


def blocked_of(kube: FakeKube, name: str) -> dict[tuple[str, int], int]:
    return {
        (b["host"], b["port"]): b["count"] for b in status_of(kube, name).get("egressBlocked", [])
    }


async def test_a_session_with_host_entries_gets_its_own_pod_with_its_own_proxy_grant(
    kube: FakeKube, runners: list[ServeDouble], proxied: Reconciler
) -> None:
    server = await free_pool_pod(kube, runners)
    session = open_session(kube, network=HOSTS)
    await proxied.sessions.start(session_now(kube), pools=session_pool(), deny_all=True)
    status = session_status(kube)
    assert status["startMode"] == "cold" and status["podName"] != "warm-0"
    assert POOL_STATE_LABEL in kube.pods[(NAMESPACE, "warm-0")]["metadata"]["labels"]
    assert kube.pods[(NAMESPACE, "warm-0")]["metadata"]["labels"][POOL_STATE_LABEL] != (
        POOL_CLAIMED
    )
    configmap = kube.configmaps[(NAMESPACE, status["podName"])]
    env = json.loads(configmap["data"][CONFIG_KEY])["env"]
    assert env["PYTHONUNBUFFERED"] == "1"
    url = urllib.parse.urlsplit(env["HTTPS_PROXY"])
    assert (url.hostname, url.port) == ("10.96.0.50", 3128)
    assert env["HTTP_PROXY"] == env["npm_config_https_proxy"] == url.geturl()
    grant = verify(str(url.password), PROXY_KEY, datetime.now(UTC).timestamp())
    assert grant is not None
    assert (grant.execution, grant.namespace) == (session["metadata"]["uid"], NAMESPACE)
    assert grant.hosts == (HostGrant("pypi.org", (80, 443)),)
    created = datetime.fromisoformat(session["metadata"]["creationTimestamp"]).timestamp()
    spec = CodeSessionSpec.model_validate(session["spec"])
    assert grant.expires == int(created + spec.max_lifetime_seconds + MAX_TIMEOUT_SECONDS + 60)
    policy = kube.network_policies[(NAMESPACE, status["podName"])]
    assert policy["spec"]["podSelector"]["matchLabels"][SESSION_LABEL] == SESSION
    (rule,) = policy["spec"]["egress"]
    assert rule["ports"] == [{"port": 3128, "protocol": "TCP"}]
    assert rule["to"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/component": "egress-proxy"
    }
    # Each run's request carries the env the pod was started with (the runner checks it).
    own = await ServeDouble(session=True).start()
    runners.append(own)
    serve_from(kube, (NAMESPACE, status["podName"]), own)
    await proxied.sessions.tick(session_now(kube), [])
    ask(kube, "first", ago(1))
    await drain(proxied, kube)
    assert status_of(kube, "first")["phase"] == "Succeeded"
    assert own.requests[0]["config"]["env"] == env
    assert server.runs == 0


async def test_host_entries_without_the_proxy_are_an_invalid_spec(
    kube: FakeKube, reconciler: Reconciler
) -> None:
    open_session(kube, network=HOSTS)
    with pytest.raises(kopf.PermanentError, match="egress proxy"):
        await reconciler.sessions.start(session_now(kube), pools=[], deny_all=True)
    status = session_status(kube)
    assert (status["phase"], status["reason"]) == ("Ended", "InvalidSpec")
    assert "host entries go through the egress proxy" in status["message"]
    assert not kube.pods


async def test_each_run_reports_what_the_proxy_refused_it(
    kube: FakeKube,
    runners: list[ServeDouble],
    proxied: Reconciler,
    monitor: tuple[Tally, int],
) -> None:
    tally = monitor[0]
    scripts = [
        Script(during=refuse(tally, kube, "other.fake:80", "other.fake:80")),
        Script(during=refuse(tally, kube, "evil.fake:443")),
        Script(),
    ]
    await ready_session(kube, proxied, runners, *scripts, network=HOSTS)
    for name, seconds in (("one", 3), ("two", 2), ("three", 1)):
        ask(kube, name, ago(seconds))
    await drain(proxied, kube)
    assert [status_of(kube, n)["phase"] for n in ("one", "two", "three")] == ["Succeeded"] * 3
    assert blocked_of(kube, "one") == {("other.fake", 80): 2}
    assert blocked_of(kube, "two") == {("evil.fake", 443): 1}
    assert blocked_of(kube, "three") == {}
    warned = [(e.uid, e.message) for e in kube.events if e.reason == "EgressBlocked"]
    assert warned == [
        (uid_of(kube, "one"), "the egress proxy refused requests to other.fake:80 x2"),
        (uid_of(kube, "two"), "the egress proxy refused requests to evil.fake:443 x1"),
    ]


async def ready_refusing_session(
    kube: FakeKube, runners: list[ServeDouble], proxied: Reconciler, tally: Tally
) -> None:
    """A session with host entries whose two runs are refused other.fake:80 and evil.fake:443."""
    scripts = [
        Script(during=refuse(tally, kube, "other.fake:80")),
        Script(during=refuse(tally, kube, "evil.fake:443")),
    ]
    await ready_session(kube, proxied, runners, *scripts, network=HOSTS)


def api_server_busy(kube: FakeKube) -> None:
    kube.fail("endpoint_addresses", KubeError(503, "ServiceUnavailable", "the API server is busy"))


def replica_does_not_answer(kube: FakeKube) -> None:
    kube.endpoints[PROXY_SERVICE] = ["127.0.0.2"]  # a replica whose monitor does not answer


@pytest.mark.parametrize("break_monitors", [api_server_busy, replica_does_not_answer])
async def test_refusals_that_cannot_be_read_never_fail_a_run_and_are_unknown_not_zero(
    kube: FakeKube,
    runners: list[ServeDouble],
    proxied: Reconciler,
    monitor: tuple[Tally, int],
    break_monitors: Callable[[FakeKube], None],
) -> None:
    await ready_refusing_session(kube, runners, proxied, monitor[0])
    break_monitors(kube)
    ask(kube, "one", ago(2))
    await drain(proxied, kube)
    assert status_of(kube, "one")["phase"] == "Succeeded"
    assert "egressBlocked" not in status_of(kube, "one")
    kube.endpoints[PROXY_SERVICE] = ["127.0.0.1"]
    # The next run asks before it starts and reports only its own: not other.fake too, as the
    # first run's refusals were unknown, never counted as none.
    ask(kube, "two", ago(1))
    await drain(proxied, kube)
    assert blocked_of(kube, "two") == {("evil.fake", 443): 1}


async def test_a_session_without_host_entries_never_asks_the_proxy(
    kube: FakeKube, runners: list[ServeDouble], proxied: Reconciler
) -> None:
    await ready_session(kube, proxied, runners)
    ask(kube, "first", ago(1))
    await drain(proxied, kube)
    assert status_of(kube, "first")["phase"] == "Succeeded"
    assert "endpoint_addresses" not in kube.calls and "read_service_ip" not in kube.calls
    assert (
        "HTTPS_PROXY"
        not in json.loads(
            kube.configmaps[(NAMESPACE, session_status(kube)["podName"])]["data"][CONFIG_KEY]
        )["env"]
    )


async def test_a_run_through_the_sessions_kernel_is_recorded_as_the_kernels_word(
    kube: FakeKube, runners: list[ServeDouble], reconciler: Reconciler
) -> None:
    kernel = Script(result=runner_wire.result(exitCode=0, value=None, stateLost=False, kernel=True))
    fresh = Script(result=runner_wire.result(exitCode=3, value=None, stateLost=False, kernel=False))
    await ready_session(kube, reconciler, runners, kernel, fresh)
    ask(kube, "in-kernel", ago(2))
    ask(kube, "fresh", ago(1))
    await drain(reconciler, kube)
    assert status_of(kube, "in-kernel")["reportedBy"] == "sessionKernel"
    assert (status_of(kube, "fresh")["reportedBy"], status_of(kube, "fresh")["exitCode"]) == (
        "runner",
        3,
    )


async def test_a_direct_run_in_a_session_logs_its_milestones_and_a_refused_one_none(
    kube: FakeKube,
    runners: list[ServeDouble],
    reconciler: Reconciler,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The operator's `direct timings` line, which the bench divides a direct run by."""
    await ready_session(kube, reconciler, runners, Script(outputs=[("stdout", "1\n")]))
    runs = DirectRuns(reconciler.sessions, kube, reconciler.store_outputs)
    spec = {"language": "python", "source": "print(1)", "session": SESSION}
    run = {"metadata": {"name": "direct-1"}, "spec": spec}
    caplog.set_level("INFO", logger="sandpod_operator.pools.warm")

    record = await runs.run(NAMESPACE, run, session_now(kube))
    ended = copy.deepcopy(session_now(kube))
    ended["status"]["phase"] = "Ended"
    with pytest.raises(NotServing):
        await runs.run(NAMESPACE, {**run, "metadata": {"name": "direct-2"}}, ended)
    await asyncio.gather(*runs.writers)

    assert record["status"]["stdout"] == "1\n"
    assert_only_direct_1_logged_its_milestones(caplog)
    assert reconciler.warm.marks == {}

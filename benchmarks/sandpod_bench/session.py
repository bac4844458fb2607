"""The session sections' helpers: opening sessions (through the gateway, or as a CodeSession
for the kubectl path), waiting until they are Ready, one session per throughput client, and
the audit of the sessions' own execution counts."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx
from kubernetes import client
from sandpod_contract.names import GROUP, SESSION_PLURAL, VERSION

from sandpod_bench import manifests
from sandpod_bench.recorder import Observation
from sandpod_bench.workloads import Attempt, Workload


class SessionNotReady(RuntimeError):
    pass


def session_phase(custom: client.CustomObjectsApi, namespace: str, name: str) -> str | None:
    session: Any = custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, SESSION_PLURAL, name
    )
    return (session.get("status") or {}).get("phase")


def wait_ready(custom: client.CustomObjectsApi, namespace: str, name: str, timeout: float) -> None:
    """Until the session's sandbox is up (phase Ready); SessionNotReady after `timeout` or
    when it ended."""
    deadline = time.monotonic() + timeout
    phase = None
    while time.monotonic() < deadline:
        phase = session_phase(custom, namespace, name)
        if phase == "Ready":
            return
        if phase == "Ended":
            break
        time.sleep(0.2)
    raise SessionNotReady(f"session {namespace}/{name} is {phase or 'not started'}")


def open_through_gateway(http: httpx.Client) -> str:
    """POST /v1/sessions: the session's id (its CodeSession's name)."""
    response = http.post(
        "/v1/sessions",
        json={"language": manifests.LANGUAGE},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    if response.status_code not in (200, 201):
        raise SessionNotReady(f"POST /v1/sessions: HTTP {response.status_code} {response.text}")
    return str(response.json()["id"])


def create_session(custom: client.CustomObjectsApi, namespace: str, name: str) -> str:
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, SESSION_PLURAL, manifests.code_session(name)
    )
    return name


class PerClient:
    """A workload for closed-loop clients where each client (thread) keeps to a workload of
    its own, e.g. its own session: the first call from a thread takes the next free one."""

    def __init__(self, workloads: Sequence[Workload]) -> None:
        self._free = list(workloads)
        self._lock = threading.Lock()
        self._mine = threading.local()

    def __call__(self, index: int) -> Attempt:
        workload: Workload | None = getattr(self._mine, "workload", None)
        if workload is None:
            with self._lock:
                if not self._free:
                    raise RuntimeError("more clients than workloads")
                workload = self._free.pop(0)
            self._mine.workload = workload
        return workload(index)


def executions_by_session(observations: Iterable[Observation]) -> Counter[str]:
    """How many executions the namespace saw naming each session."""
    counts: Counter[str] = Counter()
    for observation in observations:
        session = ((observation.execution or {}).get("spec") or {}).get("session")
        if session:
            counts[str(session)] += 1
    return counts


def versions_seen(observations: Iterable[Observation], names: Iterable[str]) -> int:
    """The writes that changed the named executions, as the bench's watch saw them (one
    resourceVersion each; a watch that missed some while the API server was away counts
    fewer). Pure."""
    wanted = set(names)
    return sum(len(o.versions) for o in observations if o.name in wanted)


def count_mismatches(
    seen: Mapping[str, int], session_counts: Mapping[str, int | None]
) -> dict[str, tuple[int, int | None]]:
    """Sessions whose own executionCount differs from the executions seen naming them
    (a run counted twice, or never run): name -> (seen, counted). Pure."""
    return {
        name: (seen.get(name, 0), counted)
        for name, counted in session_counts.items()
        if counted != seen.get(name, 0)
    }


def execution_counts(
    custom: client.CustomObjectsApi, namespace: str, names: Iterable[str]
) -> dict[str, int | None]:
    counts: dict[str, int | None] = {}
    for name in names:
        session: Any = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, SESSION_PLURAL, name
        )
        count = (session.get("status") or {}).get("executionCount")
        counts[name] = None if count is None else int(count)
    return counts

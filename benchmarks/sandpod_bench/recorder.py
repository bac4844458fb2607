"""Watches the bench's CodeExecutions and their pods, and records when each milestone of
each execution was seen (arrival time of the watch event, wall clock). Clients wait on it
for terminal statuses, so that no run needs a watch of its own."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from sandpod_contract.models import TERMINAL_PHASES
from sandpod_contract.names import EXECUTION_LABEL, FINALIZER, GROUP, PLURAL, VERSION

from sandpod_bench.containerd import ContainerdEvents
from sandpod_bench.kube import list_raw, watch_events

logger = logging.getLogger(__name__)

WATCH_SECONDS = 60

Manifest = dict[str, Any]


@dataclass
class Observation:
    """Everything seen about one execution (by name; names are unique per bench run)."""

    namespace: str
    name: str
    milestones: dict[str, float] = field(default_factory=dict)
    execution: Manifest | None = None
    pod: Manifest | None = None  # the last state seen (the operator deletes finished pods)
    pod_names: set[str] = field(default_factory=set)
    # Every resourceVersion of the execution seen: one per write that changed it.
    versions: set[str] = field(default_factory=set)

    def mark(self, milestone: str, at: float) -> None:
        self.milestones.setdefault(milestone, at)

    @property
    def phase(self) -> str | None:
        return ((self.execution or {}).get("status") or {}).get("phase")

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def stdout(self) -> str | None:
        return ((self.execution or {}).get("status") or {}).get("stdout")


def _condition_true(pod: Manifest, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _terminated(pod: Manifest) -> dict[str, Any] | None:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return {**terminated, "containerID": container.get("containerID")}
    return None


class Recorder:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        containerd: ContainerdEvents | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self._containerd = containerd
        self._observations: dict[str, Observation] = {}
        self._changed = threading.Condition()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        # The longest time a watch could not reach the API server (other sessions restart it).
        self.outage_seconds = 0.0

    # --- watching ----------------------------------------------------------------------

    def start(self) -> None:
        custom = client.CustomObjectsApi(self._api)
        core = client.CoreV1Api(self._api)
        sources: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
            (
                "executions",
                custom.list_namespaced_custom_object,
                (GROUP, VERSION, self.namespace, PLURAL),
                {},
            ),
            (
                "pods",
                core.list_namespaced_pod,
                (self.namespace,),
                {"label_selector": EXECUTION_LABEL},
            ),
        ]
        ready = []
        for name, method, args, kwargs in sources:
            listed = threading.Event()
            ready.append(listed)
            thread = threading.Thread(
                target=self._follow,
                args=(name, method, args, kwargs, listed),
                name=f"recorder-{name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        for listed in ready:
            if not listed.wait(timeout=60):
                raise RuntimeError("the recorder could not list executions and pods")

    def request_stop(self) -> None:
        """Ask the watches to end (each does when its current watch call returns)."""
        self._stopped.set()

    def stop(self) -> None:
        self.request_stop()
        for thread in self._threads:
            thread.join(timeout=WATCH_SECONDS + 5)

    def _follow(
        self,
        kind: str,
        method: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        listed: threading.Event,
    ) -> None:
        handle = self._on_execution if kind == "executions" else self._on_pod
        resource_version: str | None = None
        failing_since: float | None = None
        while not self._stopped.is_set():
            try:
                if resource_version is None:
                    body = list_raw(method, *args, **kwargs)
                    now = time.time()
                    for item in body.get("items") or []:
                        handle("ADDED", item, now)
                    resource_version = body["metadata"]["resourceVersion"]
                    listed.set()
                for event_type, item in watch_events(
                    method,
                    *args,
                    resource_version=resource_version,
                    timeout_seconds=WATCH_SECONDS,
                    **kwargs,
                ):
                    if failing_since is not None:
                        self._recovered(kind, failing_since)
                        failing_since = None
                    resource_version = item.get("metadata", {}).get(
                        "resourceVersion", resource_version
                    )
                    if event_type != "BOOKMARK":
                        handle(event_type, item, time.time())
                    if self._stopped.is_set():
                        return
                if failing_since is not None:
                    self._recovered(kind, failing_since)
                    failing_since = None
            except Exception as error:
                if isinstance(error, client.ApiException) and error.status == 410:
                    resource_version = None  # expired: list again
                    continue
                if failing_since is None:
                    failing_since = time.monotonic()
                    logger.warning(
                        "watching %s in %s failed, retrying: %s", kind, self.namespace, error
                    )
                self._stopped.wait(1)

    def _recovered(self, kind: str, failing_since: float) -> None:
        """After a failure streak: note how long the watch was down."""
        down = time.monotonic() - failing_since
        with self._changed:
            self.outage_seconds = max(self.outage_seconds, down)
        logger.warning("watching %s in %s works again after %.0f s", kind, self.namespace, down)

    def _observation(self, name: str) -> Observation:
        observation = self._observations.get(name)
        if observation is None:
            observation = Observation(self.namespace, name)
            self._observations[name] = observation
        return observation

    def _on_execution(self, event_type: str, item: Manifest, at: float) -> None:
        if event_type == "DELETED":
            return
        metadata = item.get("metadata") or {}
        with self._changed:
            observation = self._observation(metadata.get("name", ""))
            observation.mark("created", at)
            observation.versions.add(str(metadata.get("resourceVersion") or ""))
            if FINALIZER in (metadata.get("finalizers") or []) or item.get("status"):
                observation.mark("operator_seen", at)
            observation.execution = item
            if observation.phase == "Running":
                observation.mark("running", at)
            if observation.terminal:
                observation.mark("status_written", at)
            self._changed.notify_all()

    def _on_pod(self, event_type: str, item: Manifest, at: float) -> None:
        metadata = item.get("metadata") or {}
        execution_name = (metadata.get("labels") or {}).get(EXECUTION_LABEL)
        if not execution_name:
            return
        with self._changed:
            observation = self._observation(execution_name)
            observation.pod_names.add(metadata.get("name", ""))
            observation.mark("pod_created", at)
            if (item.get("spec") or {}).get("nodeName") or _condition_true(item, "PodScheduled"):
                observation.mark("pod_scheduled", at)
            if _terminated(item):
                observation.mark("exit_reported", at)
            observation.pod = item
            self._changed.notify_all()

    # --- reading -----------------------------------------------------------------------

    def wait_terminal(self, name: str, timeout: float) -> Observation | None:
        """The execution once its terminal status has been seen; None after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                observation = self._observations.get(name)
                if observation is not None and observation.terminal:
                    return observation
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._changed.wait(remaining)

    def get(self, name: str) -> Observation | None:
        with self._changed:
            return self._observations.get(name)

    def timeline(self, name: str) -> dict[str, float]:
        """The milestones of one execution, containerd's included (when it is followed)."""
        with self._changed:
            observation = self._observations.get(name)
            if observation is None:
                return {}
            milestones = dict(observation.milestones)
            pod = observation.pod
        if self._containerd is not None and pod is not None:
            pod_name = pod["metadata"]["name"]
            sandbox = self._containerd.sandbox(self.namespace, pod_name)
            if sandbox is not None:
                _put(milestones, "sandbox_created", sandbox.created)
                _put(milestones, "sandbox_started", sandbox.started)
            terminated = _terminated(pod)
            if terminated and terminated.get("containerID"):
                container = self._containerd.container(terminated["containerID"])
                if container is not None:
                    _put(milestones, "runner_started", container.started)
                    _put(milestones, "program_exited", container.exited)
        return milestones

    def all(self) -> list[Observation]:
        with self._changed:
            return list(self._observations.values())


def _put(milestones: dict[str, float], name: str, value: float | None) -> None:
    if value is not None:
        milestones[name] = value

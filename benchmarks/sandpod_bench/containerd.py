"""Container lifecycle times from containerd's event stream (`ctr events`), to the
nanosecond: when a pod's gVisor sandbox was created and started, when the runner's container
started and when it exited. The kubelet reports these to the API server only later (its
relist and status updates), and in 1-second timestamps.
"""

from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CRI_NAMESPACE = "k8s.io"
SANDBOX_KIND_LABEL = "io.cri-containerd.kind"
POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"


@dataclass(frozen=True)
class ContainerdEvent:
    time: float  # seconds since the epoch
    namespace: str
    topic: str
    payload: dict[str, Any]


def parse_event_line(line: str) -> ContainerdEvent | None:
    """One line of `ctr events`:
    `2026-11-22 03:33:26.554271817 +0000 UTC k8s.io /tasks/exit {...}`; None if it is not one.
    """
    parts = line.strip().split(" ", 6)
    if len(parts) < 7 or parts[3] != "UTC" or not parts[5].startswith("/"):
        return None
    date, clock, offset, _, namespace, topic, payload_text = parts
    whole, _, fraction = clock.partition(".")
    try:
        stamp = datetime.strptime(f"{date} {whole} {offset}", "%Y-%m-%d %H:%M:%S %z")
        payload = json.loads(payload_text)
    except ValueError:
        return None
    seconds = stamp.astimezone(UTC).timestamp() + (float(f"0.{fraction}") if fraction else 0.0)
    return ContainerdEvent(seconds, namespace, topic, payload if isinstance(payload, dict) else {})


@dataclass
class ContainerTimes:
    created: float | None = None
    started: float | None = None
    exited: float | None = None


@dataclass
class ContainerdLedger:
    """What the event stream told about containers of pods in namespaces starting with
    `namespace_prefix` (the sandbox of each pod; other containers by id)."""

    namespace_prefix: str
    containers: dict[str, ContainerTimes] = field(default_factory=dict)
    sandbox_of_pod: dict[tuple[str, str], str] = field(default_factory=dict)

    def apply(self, event: ContainerdEvent) -> None:
        if event.namespace != CRI_NAMESPACE:
            return
        payload = event.payload
        if event.topic == "/containers/create":
            self.containers.setdefault(
                str(payload.get("id")), ContainerTimes()
            ).created = event.time
        elif event.topic == "/containers/update":
            labels = payload.get("labels") or {}
            namespace = str(labels.get(POD_NAMESPACE_LABEL, ""))
            if labels.get(SANDBOX_KIND_LABEL) == "sandbox" and namespace.startswith(
                self.namespace_prefix
            ):
                pod = (namespace, str(labels.get(POD_NAME_LABEL, "")))
                self.sandbox_of_pod.setdefault(pod, str(payload.get("id")))
        elif event.topic == "/tasks/start":
            times = self.containers.get(str(payload.get("container_id")))
            if times is not None and times.started is None:
                times.started = event.time
        elif event.topic == "/tasks/exit":
            container_id = str(payload.get("container_id"))
            # Exec'd processes exit too (id != container_id); only the container's own task.
            times = self.containers.get(container_id)
            if times is not None and payload.get("id") == container_id and times.exited is None:
                times.exited = event.time
        elif event.topic == "/containers/delete":
            pass  # kept: the bench reads them after the pod is gone

    def sandbox(self, namespace: str, pod_name: str) -> ContainerTimes | None:
        sandbox_id = self.sandbox_of_pod.get((namespace, pod_name))
        return self.containers.get(sandbox_id) if sandbox_id else None

    def container(self, container_id: str) -> ContainerTimes | None:
        """By the id in a pod's containerStatuses (`containerd://<id>`) or the bare id."""
        return self.containers.get(container_id.removeprefix("containerd://"))


class ContainerdEvents:
    """`ctr events` as a child process, folded into a ContainerdLedger by a thread."""

    def __init__(self, ctr: str, address: Path, namespace_prefix: str) -> None:
        self._command = [ctr, "--address", str(address), "events"]
        self._lock = threading.Lock()
        self._ledger = ContainerdLedger(namespace_prefix)
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            self._command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._thread = threading.Thread(target=self._read, name="containerd-events", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            event = parse_event_line(line)
            if event is not None:
                with self._lock:
                    self._ledger.apply(event)

    def sandbox(self, namespace: str, pod_name: str) -> ContainerTimes | None:
        with self._lock:
            return self._ledger.sandbox(namespace, pod_name)

    def container(self, container_id: str) -> ContainerTimes | None:
        with self._lock:
            return self._ledger.container(container_id)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=5)

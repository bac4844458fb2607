"""Watches every CodeExecution and sandbox pod in this session's namespaces, from a thread.

It remembers, per execution, the latest object, every distinct terminal status it was seen
with (a terminal status must be written once and never change) and the uid of every pod
ever created for it. Watches resume from the last resourceVersion after a broken
connection (an API server restart included), and re-list when that is too old.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from executions import TERMINAL
from kubernetes import client, watch
from sandpod_testkit.kube import GROUP, PLURAL, VERSION

Key = tuple[str, str]  # (namespace, name)
EXECUTION_LABEL = "sandpod.dev/execution"
SANDBOX_SELECTOR = "sandpod.dev/role=sandbox"
RETRY_SECONDS = 0.5


def terminal_signature(status: dict[str, Any]) -> tuple[Any, ...]:
    """What of a terminal status must never change once written."""
    return tuple(
        status.get(field)
        for field in ("phase", "reason", "exitCode", "signal", "finishedAt", "podName")
    )


class ClusterTracker:
    def __init__(self, api_client: client.ApiClient, namespace_prefix: str) -> None:
        self.objects = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.prefix = namespace_prefix
        self.executions: dict[Key, dict[str, Any]] = {}
        self.terminal_statuses: dict[Key, set[tuple[Any, ...]]] = defaultdict(set)
        self.pod_uids: dict[Key, set[str]] = defaultdict(set)
        self.changed = threading.Condition()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._follow, args=(self._list_executions, self._on_execution),
                             name="tracker-executions", daemon=True),
            threading.Thread(target=self._follow, args=(self._list_pods, self._on_pod),
                             name="tracker-pods", daemon=True),
        ]  # fmt: skip

    def __enter__(self) -> ClusterTracker:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=15)

    # --- what tests ask --------------------------------------------------------------------

    def wait_terminal(self, keys: Iterable[Key], timeout: float) -> dict[Key, dict[str, Any]]:
        """The final objects of `keys`; those not terminal within `timeout` are left out."""
        wanted = set(keys)
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                done = {key: self.executions[key] for key in wanted if self._terminal(key)}
                remaining = deadline - time.monotonic()
                if len(done) == len(wanted) or remaining <= 0:
                    return done
                self.changed.wait(timeout=min(remaining, 5))

    def names_in(self, namespace: str) -> list[str]:
        """Executions seen in `namespace` so far."""
        with self.changed:
            return [name for ns, name in self.executions if ns == namespace]

    def pods_in(self, namespace: str) -> set[str]:
        """Uids of every sandbox pod ever seen in `namespace`."""
        with self.changed:
            return set().union(
                *(uids for (ns, _), uids in self.pod_uids.items() if ns == namespace)
            )

    def status(self, key: Key) -> dict[str, Any]:
        with self.changed:
            return dict((self.executions.get(key) or {}).get("status") or {})

    def pods_of(self, key: Key) -> set[str]:
        with self.changed:
            return set(self.pod_uids.get(key, set()))

    def all_pod_uids(self) -> set[str]:
        with self.changed:
            return set().union(*self.pod_uids.values()) if self.pod_uids else set()

    def terminal_statuses_of(self, key: Key) -> set[tuple[Any, ...]]:
        with self.changed:
            return set(self.terminal_statuses.get(key, set()))

    def _terminal(self, key: Key) -> bool:
        phase = ((self.executions.get(key) or {}).get("status") or {}).get("phase")
        return phase in TERMINAL

    # --- watching ----------------------------------------------------------------------------

    def _list_executions(self, **options: Any) -> Any:
        return self.objects.list_cluster_custom_object(GROUP, VERSION, PLURAL, **options)

    def _list_pods(self, **options: Any) -> Any:
        return self.core.list_pod_for_all_namespaces(label_selector=SANDBOX_SELECTOR, **options)

    def _on_execution(self, kind: str, item: dict[str, Any]) -> None:
        meta = item["metadata"]
        key = (meta["namespace"], meta["name"])
        if kind == "DELETED":
            return
        self.executions[key] = item
        status = item.get("status") or {}
        if status.get("phase") in TERMINAL:
            self.terminal_statuses[key].add(terminal_signature(status))

    def _on_pod(self, kind: str, item: dict[str, Any]) -> None:
        meta = item["metadata"]
        execution = (meta.get("labels") or {}).get(EXECUTION_LABEL)
        if execution:
            self.pod_uids[(meta["namespace"], execution)].add(meta["uid"])

    def _follow(
        self, list_call: Callable[..., Any], handle: Callable[[str, dict[str, Any]], None]
    ) -> None:
        resource_version: str | None = None
        while not self.stopping.is_set():
            try:
                if resource_version is None:
                    # Plain dicts with the API's field names, as the watch's raw objects.
                    body = json.loads(list_call(_preload_content=False).data)
                    with self.changed:
                        for item in body["items"]:
                            if item["metadata"]["namespace"].startswith(self.prefix):
                                handle("ADDED", item)
                        self.changed.notify_all()
                    resource_version = body["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    list_call,
                    resource_version=resource_version,
                    timeout_seconds=10,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    item = event["raw_object"]
                    resource_version = item["metadata"].get("resourceVersion", resource_version)
                    if event["type"] == "BOOKMARK":
                        continue
                    if not item["metadata"].get("namespace", "").startswith(self.prefix):
                        continue
                    with self.changed:
                        handle(event["type"], item)
                        self.changed.notify_all()
                    if self.stopping.is_set():
                        break
            except client.ApiException as error:
                if error.status == 410:  # too old: list again
                    resource_version = None
                time.sleep(RETRY_SECONDS)
            except Exception:
                time.sleep(RETRY_SECONDS)

"""An in-memory stand-in for the operator's Kubernetes surface (`sandpod_operator.kube.KubeApi`
and `PoolKubeApi`).

It keeps what the API server keeps for the operator's calls: objects by (namespace, name),
each with a uid and a resourceVersion; a status patch with a stale resourceVersion is a 409;
creating an existing object returns that object (as `Kube` reads it back after "409
AlreadyExists");
reads and writes hand out copies. Every call first yields to the event loop, so that
coroutines run side by side interleave as they would against a real server.

Tests can make the next call of a method fail (`fail`), or run something just before it
(`before`: another writer getting in first), and play the kubelet with `set_pod_status`.
"""

import asyncio
import copy
import itertools
import json
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import runner_wire
from sandpod_contract.names import (
    API_VERSION,
    FINISHED_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLURAL,
    POOL_FREE,
    POOL_KIND,
    POOL_LABEL,
    POOL_STATE_LABEL,
    ROLE_LABEL,
    SANDBOX_ROLE,
    SESSION_PLURAL,
)
from sandpod_contract.runner import LogSummary
from sandpod_operator.kube import Key, KubeError, LogRead, Manifest, RequestCounter

Hook = Callable[[], Awaitable[None]]

CONFLICT_MESSAGE = (
    "Operation cannot be fulfilled: the object has been modified; "
    "please apply your changes to the latest version and try again"
)


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Manifest, patch: Manifest) -> None:
    """RFC 7386 JSON merge patch, in place: null removes a key, objects merge."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def selects(selector: str, labels: Mapping[str, str]) -> bool:
    """A label selector of `key` (exists) and `key=value` terms, comma-separated."""
    for term in filter(None, selector.split(",")):
        key, equals, value = term.partition("=")
        if (key not in labels) if not equals else labels.get(key) != value:
            return False
    return True


def conflict() -> KubeError:
    return KubeError(409, "Conflict", CONFLICT_MESSAGE)


@dataclass(frozen=True)
class PostedEvent:
    uid: str
    type: str
    reason: str
    message: str


class FakeKube:
    """Satisfies `KubeApi`; the dicts are public so that tests can look at the cluster."""

    def __init__(self) -> None:
        self.counter = RequestCounter()
        self.executions: dict[Key, Manifest] = {}
        self.pools: dict[Key, Manifest] = {}
        self.sessions: dict[Key, Manifest] = {}
        self.pods: dict[Key, Manifest] = {}
        self.configmaps: dict[Key, Manifest] = {}
        self.network_policies: dict[Key, Manifest] = {}
        # Per Service: its cluster IP, and the ready addresses behind it.
        self.service_ips: dict[Key, str] = {}
        self.endpoints: dict[Key, list[str]] = {}
        self.logs: dict[Key, bytes] = {}
        self.warnings: dict[Key, str] = {}
        self.events: list[PostedEvent] = []
        self.calls: list[str] = []
        self.created: list[tuple[str, Key]] = []
        self.deleted_pods: list[Key] = []
        # etcd's limit on a stored object (the API server refuses a larger write).
        self.max_object_bytes = 1536 * 1024
        self.largest_status_write = 0
        self._versions = itertools.count(1000)
        self._faults: dict[str, list[BaseException]] = defaultdict(list)
        self._hooks: dict[str, list[Hook]] = defaultdict(list)

    # --- steering the fake ------------------------------------------------------------

    def fail(self, call: str, error: BaseException, times: int = 1) -> None:
        """The next `times` calls of method `call` raise `error` (the object is untouched)."""
        self._faults[call].extend([error] * times)

    def before(self, call: str, hook: Hook) -> None:
        """Run `hook` just before the next call of method `call` takes effect (once per call:
        register it n times for the next n calls)."""
        self._hooks[call].append(hook)

    async def _enter(self, call: str) -> None:
        self.calls.append(call)
        await asyncio.sleep(0)
        if self._hooks[call]:
            await self._hooks[call].pop(0)()
        if self._faults[call]:
            raise self._faults[call].pop(0)

    def _store(self, objects: dict[Key, Manifest], body: Manifest) -> Manifest:
        stored = copy.deepcopy(body)
        meta = stored["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._versions))
        meta["generation"] = 1
        meta.setdefault("creationTimestamp", stamp(datetime.now(UTC)))
        objects[(meta["namespace"], meta["name"])] = stored
        return stored

    def _bump(self, stored: Manifest) -> Manifest:
        stored["metadata"]["resourceVersion"] = str(next(self._versions))
        return copy.deepcopy(stored)

    def add_execution(self, body: Manifest) -> Manifest:
        """A CodeExecution as the API server stores it (the user's create)."""
        return copy.deepcopy(self._store(self.executions, body))

    def add_session(self, body: Manifest) -> Manifest:
        """A CodeSession as the API server stores it (the user's create)."""
        return copy.deepcopy(self._store(self.sessions, body))

    def add_pool(self, body: Manifest) -> Manifest:
        """A SandboxPool as the API server stores it (the user's create)."""
        return copy.deepcopy(self._store(self.pools, body))

    def update_pool_spec(self, namespace: str, name: str, spec: Manifest) -> Manifest:
        """The user edits the pool: a new spec and generation."""
        stored = self.pools[(namespace, name)]
        merge_patch(stored["spec"], spec)
        stored["metadata"]["generation"] += 1
        return self._bump(stored)

    def claim_pod(self, key: Key, execution_name: str, execution_uid: str) -> Manifest:
        """An execution claims a free pool pod, as the warm path's claim patch does: its
        labels say claimed, and the execution becomes its only owner."""
        stored = self.pods[key]
        labels = stored["metadata"]["labels"]
        labels.update(
            {
                "sandpod.dev/pool-state": "claimed",
                "sandpod.dev/claimed-by": execution_uid,
                "sandpod.dev/execution": execution_name,
            }
        )
        stored["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "sandpod.dev/v1alpha1",
                "kind": "CodeExecution",
                "name": execution_name,
                "uid": execution_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        return self._bump(stored)

    def write_status(self, namespace: str, name: str, status: Manifest) -> Manifest:
        """Another writer's status patch (no precondition): moves the resourceVersion."""
        stored = self.executions[(namespace, name)]
        merge_patch(stored.setdefault("status", {}), status)
        return self._bump(stored)

    def written_first(self, namespace: str, name: str, status: Manifest, times: int = 1) -> None:
        """Another writer patches this status just before each of the next `times` status
        writes: those writes' resourceVersion is stale."""

        async def write() -> None:
            self.write_status(namespace, name, status)

        for _ in range(times):
            self.before("patch_execution_status", write)

    def set_pod_status(
        self, namespace: str, name: str, status: Manifest, *, created: datetime | None = None
    ) -> Manifest:
        """The kubelet reports: replace the pod's status; the new pod, as a watch shows it."""
        stored = self.pods[(namespace, name)]
        stored["status"] = copy.deepcopy(status)
        if created is not None:
            stored["metadata"]["creationTimestamp"] = stamp(created)
        return self._bump(stored)

    def post_event(
        self, objs: Mapping[str, Any], *, type: str, reason: str, message: str = ""
    ) -> None:
        """Stands in for kopf.event (the Reconciler's `post_event`)."""
        self.events.append(PostedEvent(objs["metadata"]["uid"], type, reason, message))

    # --- KubeApi ----------------------------------------------------------------------

    async def close(self) -> None:
        return None

    async def _create(self, call: str, objects: dict[Key, Manifest], body: Manifest) -> Any:
        await self._enter(call)
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key in objects:
            return copy.deepcopy(objects[key])
        self.created.append((body["kind"], key))
        return copy.deepcopy(self._store(objects, body))

    async def create_configmap(self, body: Manifest, *, uid: str) -> Manifest | None:
        configmap: Manifest | None = await self._create("create_configmap", self.configmaps, body)
        return configmap

    async def create_network_policy(self, body: Manifest, *, uid: str | None) -> Manifest | None:
        policy: Manifest | None = await self._create(
            "create_network_policy", self.network_policies, body
        )
        return policy

    def add_foreign(self, objects: dict[Key, Manifest], body: Manifest) -> Manifest:
        """An object someone else created (no ownerReference of ours), e.g. in the way."""
        return copy.deepcopy(self._store(objects, body))

    async def create_pod(self, body: Manifest, *, uid: str) -> Manifest | None:
        created = {**body, "status": {"phase": "Pending", "qosClass": "Burstable"}}
        pod: Manifest | None = await self._create("create_pod", self.pods, created)
        return pod

    async def read_pod(self, namespace: str, name: str, *, uid: str | None) -> Manifest | None:
        await self._enter("read_pod")
        return copy.deepcopy(self.pods.get((namespace, name)))

    async def delete_pod(self, namespace: str, name: str, *, uid: str | None) -> None:
        await self._enter("delete_pod")
        if self.pods.pop((namespace, name), None) is not None:
            self.deleted_pods.append((namespace, name))

    async def read_pod_log(self, read: LogRead) -> LogSummary:
        await self._enter("read_pod_log")
        if (read.namespace, read.name) not in self.pods:
            raise KubeError(404, "NotFound", f'pods "{read.name}" not found')
        reader = read.reader()
        reader.feed(self.logs.get((read.namespace, read.name), b"")[: read.limit_bytes])
        return reader.finish()

    async def latest_warning(self, namespace: str, pod_name: str, *, uid: str | None) -> str | None:
        await self._enter("latest_warning")
        return self.warnings.get((namespace, pod_name))

    async def list_pods(
        self, namespace: str, *, label_selector: str, uid: str | None
    ) -> list[Manifest]:
        await self._enter("list_pods")
        return [
            copy.deepcopy(pod)
            for (space, _), pod in self.pods.items()
            if space == namespace and selects(label_selector, pod["metadata"].get("labels") or {})
        ]

    async def patch_pod(
        self, namespace: str, name: str, *, uid: str | None, patch: Manifest
    ) -> Manifest:
        """Merge patch; a resourceVersion in the patch is a precondition (409 if stale)."""
        await self._enter("patch_pod")
        stored = self.pods.get((namespace, name))
        if stored is None:
            raise KubeError(404, "NotFound", f'pods "{name}" not found')
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != stored["metadata"]["resourceVersion"]:
            raise conflict()
        merge_patch(stored, patch)
        return self._bump(stored)

    async def read_log_head(
        self, namespace: str, name: str, *, uid: str | None, limit_bytes: int
    ) -> bytes:
        await self._enter("read_log_head")
        if (namespace, name) not in self.pods:
            raise KubeError(404, "NotFound", f'pods "{name}" not found')
        return self.logs.get((namespace, name), b"")[:limit_bytes]

    def add_pool_pod(
        self,
        namespace: str,
        name: str,
        *,
        pool: str,
        port: int,
        credential: str,
        ready: bool = True,
    ) -> Manifest:
        """A pool controller's free pod (as a watch shows it): its runner's credential line
        opens its log, and it listens on 127.0.0.1:`port` (a local serve-protocol server)."""
        serve = {"serve": {"port": port, "credential": credential}}
        self.logs[(namespace, name)] = json.dumps(serve).encode() + b"\n"
        ready_condition = {"type": "Ready", "status": "True" if ready else "False"}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    MANAGED_BY_LABEL: MANAGED_BY,
                    ROLE_LABEL: SANDBOX_ROLE,
                    POOL_LABEL: pool,
                    POOL_STATE_LABEL: POOL_FREE,
                },
                "ownerReferences": [
                    {"apiVersion": API_VERSION, "kind": POOL_KIND, "name": pool, "uid": "p"}
                ],
            },
            "spec": {
                "containers": [
                    {"name": "sandbox", "ports": [{"name": "runner", "containerPort": port}]}
                ]
            },
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [ready_condition]},
        }
        return copy.deepcopy(self._store(self.pods, body))

    async def create_execution(self, body: Manifest) -> Manifest:
        await self._enter("create_execution")
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key in self.executions:
            raise KubeError(409, "AlreadyExists")
        return self.add_execution(body)

    async def get_execution(self, namespace: str, name: str, *, uid: str | None) -> Manifest | None:
        await self._enter("get_execution")
        return copy.deepcopy(self.executions.get((namespace, name)))

    @staticmethod
    def _at_version(
        store: dict[Key, Manifest], plural: str, key: Key, resource_version: str
    ) -> Manifest:
        """The stored object if it is still at `resource_version`; else 404 or 409, as the
        API server answers a conditional status patch."""
        stored = store.get(key)
        if stored is None:
            raise KubeError(404, "NotFound", f'{plural} "{key[1]}" not found')
        if stored["metadata"]["resourceVersion"] != resource_version:
            raise conflict()
        return stored

    async def patch_execution_status(
        self, namespace: str, name: str, *, uid: str | None, resource_version: str, status: Manifest
    ) -> Manifest:
        await self._enter("patch_execution_status")
        stored = self._at_version(self.executions, PLURAL, (namespace, name), resource_version)
        # As the client sends it (ASCII-escaped) and as etcd would store the result.
        self.largest_status_write = max(self.largest_status_write, len(json.dumps(status)))
        patched = copy.deepcopy(stored)
        merge_patch(patched.setdefault("status", {}), status)
        if len(json.dumps(patched)) > self.max_object_bytes:
            raise KubeError(500, "InternalError", "etcdserver: request is too large")
        self.executions[(namespace, name)] = patched
        return self._bump(patched)

    async def label_finished(
        self, namespace: str, name: str, *, uid: str, plural: str = PLURAL
    ) -> None:
        await self._enter("label_finished")
        store = self.sessions if plural == SESSION_PLURAL else self.executions
        stored = store.get((namespace, name))
        # As `Kube`: gone or re-created (uid precondition) is nothing to do.
        if stored is not None and stored["metadata"]["uid"] == uid:
            stored["metadata"].setdefault("labels", {})[FINISHED_LABEL] = "true"
            self._bump(stored)

    async def delete_execution(self, namespace: str, name: str, *, uid: str) -> None:
        await self._enter("delete_execution")
        stored = self.executions.get((namespace, name))
        # As `Kube`: the uid precondition's 409 and a 404 are both "nothing to do".
        if stored is not None and stored["metadata"]["uid"] == uid:
            del self.executions[(namespace, name)]

    async def read_service_ip(self, namespace: str, name: str) -> str | None:
        await self._enter("read_service_ip")
        return self.service_ips.get((namespace, name))

    async def endpoint_addresses(self, namespace: str, service: str) -> list[str]:
        await self._enter("endpoint_addresses")
        return list(self.endpoints.get((namespace, service), []))

    async def get_session(self, namespace: str, name: str) -> Manifest | None:
        await self._enter("get_session")
        return copy.deepcopy(self.sessions.get((namespace, name)))

    async def patch_session_status(
        self, namespace: str, name: str, *, resource_version: str, status: Manifest
    ) -> Manifest:
        await self._enter("patch_session_status")
        stored = self._at_version(
            self.sessions, SESSION_PLURAL, (namespace, name), resource_version
        )
        merge_patch(stored.setdefault("status", {}), status)
        return self._bump(stored)

    # --- PoolKubeApi --------------------------------------------------------------------

    async def apply_configmap(self, body: Manifest) -> None:
        await self._enter("apply_configmap")
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key in self.configmaps:
            self.configmaps[key]["data"] = copy.deepcopy(body["data"])
            self._bump(self.configmaps[key])
        else:
            self.created.append((body["kind"], key))
            self._store(self.configmaps, body)

    async def list_pool_pods(self, namespace: str, pool_name: str) -> list[Manifest]:
        await self._enter("list_pool_pods")
        return [
            copy.deepcopy(pod)
            for (pod_namespace, _), pod in self.pods.items()
            if pod_namespace == namespace
            and pod["metadata"].get("labels", {}).get("sandpod.dev/pool") == pool_name
        ]

    async def create_pool_pod(self, body: Manifest) -> Manifest:
        named = copy.deepcopy(body)
        named["metadata"]["name"] = body["metadata"]["generateName"] + uuid.uuid4().hex[:5]
        named["status"] = {"phase": "Pending", "qosClass": "Burstable"}
        created: Manifest = await self._create("create_pool_pod", self.pods, named)
        return created

    async def delete_pool_pod(self, namespace: str, name: str, *, resource_version: str) -> bool:
        await self._enter("delete_pool_pod")
        stored = self.pods.get((namespace, name))
        if stored is None or stored["metadata"]["resourceVersion"] != resource_version:
            return False
        del self.pods[(namespace, name)]
        self.deleted_pods.append((namespace, name))
        return True

    async def patch_pool_status(self, namespace: str, name: str, status: Manifest) -> None:
        await self._enter("patch_pool_status")
        stored = self.pools.get((namespace, name))
        if stored is None:
            raise KubeError(404, "NotFound", f'sandboxpools "{name}" not found')
        merge_patch(stored.setdefault("status", {}), status)
        self._bump(stored)


# --- what the kubelet writes into a sandbox pod's status ----------------------------------


def _sandbox_container(state: Manifest, *, image: str) -> Manifest:
    return {
        "name": "sandbox",
        "image": image,
        "ready": "running" in state,
        "restartCount": 0,
        "started": "running" in state,
        "state": state,
    }


def scheduled_condition(since: datetime) -> Manifest:
    return {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(since)}


def unschedulable_status(since: datetime) -> Manifest:
    """No node fits the sandbox (the scheduler's condition; no container yet)."""
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Insufficient memory.",
        "lastTransitionTime": stamp(since),
    }
    return {"phase": "Pending", "qosClass": "Burstable", "conditions": [condition]}


def pending_status(since: datetime, *, waiting: str = "ContainerCreating", image: str) -> Manifest:
    state = {"waiting": {"reason": waiting}}
    return {
        "phase": "Pending",
        "qosClass": "Burstable",
        "conditions": [scheduled_condition(since)],
        "containerStatuses": [_sandbox_container(state, image=image)],
    }


def running_status(started: datetime, *, image: str) -> Manifest:
    state = {"running": {"startedAt": stamp(started)}}
    return {
        "phase": "Running",
        "qosClass": "Burstable",
        "conditions": [scheduled_condition(started)],
        "containerStatuses": [_sandbox_container(state, image=image)],
        "startTime": stamp(started),
    }


def terminated_status(
    started: datetime,
    finished: datetime,
    message: str | None,
    *,
    image: str,
    exit_code: int = 0,
    reason: str | None = None,
) -> Manifest:
    """The container ended with `exit_code` (the runner's: 0 once it wrote its summary);
    `message` is what its termination log holds."""
    terminated: Manifest = {
        "exitCode": exit_code,
        "reason": reason or ("Completed" if exit_code == 0 else "Error"),
        "startedAt": stamp(started),
        "finishedAt": stamp(finished),
    }
    if message is not None:
        terminated["message"] = message
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "qosClass": "Burstable",
        "conditions": [scheduled_condition(started)],
        "containerStatuses": [_sandbox_container({"terminated": terminated}, image=image)],
        "startTime": stamp(started),
    }


def runner_reported(
    started: datetime, finished: datetime, result: Manifest, stdout: str, *, image: str
) -> tuple[Manifest, bytes]:
    """The runner reported `result` after framing `stdout`: the pod's status and its log."""
    outputs = [("stdout", stdout)] if stdout else []
    message = runner_wire.termination_message(result, len(outputs))
    status = terminated_status(started, finished, message, image=image)
    return status, runner_wire.pod_log(outputs, result)


def ready_status(started: datetime, *, image: str) -> Manifest:
    """Running, and the readiness probe passes (a pool pod's runner is ready)."""
    status = running_status(started, image=image)
    status["conditions"].append(
        {"type": "Ready", "status": "True", "lastTransitionTime": stamp(started)}
    )
    return status

"""The warm path (docs: the warm design): run an execution in a ready pod claimed from a
SandboxPool instead of creating one.

Pure parts first (does an execution fit a pool, which pods to try, the claim patch, the run
request, the runner's credential line), then `WarmPath`, which claims a pod exactly once and
runs the execution in it. The Reconciler writes the status; nothing here does.

A claim is one optimistic-concurrency patch of a free pod (its resourceVersion in the body):
of two claimers only one gets the pod, the other a 409 and tries the next. An execution
first looks for a pod it claimed before (claimed-by=<its uid>): its status write may have
been lost. The program runs only in the pod its status names (the run starts after that
write), and a second POST with the same executionId re-attaches to the run, never re-runs.
"""

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import aiohttp
import kopf
from prometheus_client import Counter, Histogram
from pydantic import ValidationError
from sandpod_contract import names
from sandpod_contract.catalog import Catalog
from sandpod_contract.models import CodeExecutionSpec, SandboxPoolSpec
from sandpod_contract.names import DIRECT_TIMINGS_LOG, TIMINGS_LOG
from sandpod_contract.quantities import parse_quantity
from sandpod_contract.runner import LogSummary, OutputListener

from sandpod_operator.executions.builders import (
    InvalidSpecError,
    Plan,
    Sandbox,
    build_runner_config,
)
from sandpod_operator.kube import API_ERRORS, KubeApi, KubeError, Manifest
from sandpod_operator.pools.builders import plan_pool
from sandpod_operator.serving.runner import RunnerAddress, RunnerUnavailable, cancel, run
from sandpod_operator.settings import OperatorSettings

logger = logging.getLogger(__name__)

# The runner's first log line is short; more than this is not it.
CREDENTIAL_LINE_BYTES = 4096
CREDENTIAL_PATTERN = re.compile(r"^[0-9a-f]{64}$")
# Pool sandboxes a run is offered to when their runners refuse it (busy, or retired).
SANDBOXES_TRIED = 3

STARTS = Counter(
    "sandpod_operator_executions_started_total",
    "Executions whose program started, by how: warm (a claimed pool pod) or cold.",
    ["mode"],
)
WAITS = Histogram(
    "sandpod_operator_execution_wait_seconds",
    "From an execution's creation to its program's start (creationTimestamp: whole seconds).",
    ["mode"],
    buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 3, 5, 10, 30, 60),
)
CLAIM_CONFLICTS = Counter(
    "sandpod_operator_pool_claim_conflicts_total",
    "Claims of a pool pod lost to another claimer (409) or to its deletion (404).",
)
POOL_MISSES = Counter(
    "sandpod_operator_pool_misses_total",
    "Executions that fit a pool but found no free ready pod, and went cold.",
)
RUNNER_FAILURES = Counter(
    "sandpod_operator_runner_failures_total",
    "Warm runs that ended without the runner's whole answer.",
    ["why"],
)


# --- pure ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """A SandboxPool as matching needs it: its language, its pods' sandbox, and whether they
    serve sessions."""

    name: str
    language: str
    sandbox: Sandbox
    sessions: bool = False

    def limits(self) -> tuple[Decimal, Decimal, Decimal]:
        return _limits(self.sandbox)


@dataclass(frozen=True)
class Wanted:
    """What an execution or a session needs of a pool pod."""

    language: str
    egress: str
    sandbox: Sandbox
    sessions: bool = False


def _limits(sandbox: Sandbox) -> tuple[Decimal, Decimal, Decimal]:
    quantities = (sandbox.memory, sandbox.cpu, sandbox.ephemeral_storage)
    return (
        parse_quantity(quantities[0]),
        parse_quantity(quantities[1]),
        parse_quantity(quantities[2]),
    )


def read_pool(pool: Manifest, catalog: Catalog, settings: OperatorSettings) -> Pool | None:
    """A pool as its controller plans its pods; None when its spec is not one it can."""
    try:
        spec = SandboxPoolSpec.model_validate(pool.get("spec") or {})
        sandbox = plan_pool(spec, catalog, settings)
    except (ValidationError, InvalidSpecError):
        return None
    name = str((pool.get("metadata") or {}).get("name"))
    return Pool(name, spec.language, sandbox, spec.sessions)


def fits(wanted: Wanted, pool: Pool) -> bool:
    """Whether a pod of `pool` serves what is wanted: the pool's language and kind (sessions
    or single executions), no network, the pool's RuntimeClass, each limit at most the pool's."""
    return (
        wanted.sessions == pool.sessions
        and wanted.language == pool.language
        and wanted.egress == "none"
        and wanted.sandbox.runtime_class_name == pool.sandbox.runtime_class_name
        and all(
            own <= most for own, most in zip(_limits(wanted.sandbox), pool.limits(), strict=True)
        )
    )


def execution_wants(spec: CodeExecutionSpec, plan: Plan) -> Wanted | None:
    """What a one-off execution needs of a pool pod; None: only runs use pools."""
    if spec.mode != "run":
        return None
    return Wanted(spec.language, spec.network.egress, plan)


def fitting_pools(
    wanted: Wanted | None,
    pools: Iterable[Manifest],
    catalog: Catalog,
    settings: OperatorSettings,
) -> list[Pool]:
    """The pools that fit, smallest first (large pods stay for large executions)."""
    if wanted is None:
        return []
    found = [
        pool
        for manifest in pools
        if (pool := read_pool(manifest, catalog, settings)) and fits(wanted, pool)
    ]
    return sorted(found, key=lambda pool: (pool.limits(), pool.name))


def pod_ready(pod: Manifest) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return ready and not meta.get("deletionTimestamp") and bool(status.get("podIP"))


def _labels(pod: Manifest) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("labels") or {})


def earlier_claim(pods: Iterable[Manifest], execution_uid: str) -> Manifest | None:
    """A pod this execution claimed before (its status write may have been lost)."""
    for pod in pods:
        gone = (pod.get("metadata") or {}).get("deletionTimestamp")
        if _labels(pod).get(names.CLAIMED_BY_LABEL) == execution_uid and not gone:
            return pod
    return None


def tenant_of(owner: Manifest) -> str:
    """The tenant an execution runs for (its tenant label; "" without one)."""
    return _labels(owner).get(names.TENANT_LABEL, "")


def candidates(
    pods: Iterable[Manifest],
    pools: list[Pool],
    tenant: str,
    pinned: Mapping[str, str] | None = None,
) -> list[Manifest]:
    """Free ready pods of `pools` that serve `tenant` or no one yet (`pinned`: this
    process's knowledge of whom a pod serves, ahead of its label), in the pools' order,
    oldest first within a pool."""
    rank = {pool.name: index for index, pool in enumerate(pools)}
    pinned = pinned or {}

    def serves(pod: Manifest) -> str | None:
        uid = str(pod["metadata"].get("uid"))
        return pinned.get(uid, _labels(pod).get(names.SERVES_TENANT_LABEL))

    free = [
        pod
        for pod in pods
        if _labels(pod).get(names.POOL_STATE_LABEL) == names.POOL_FREE
        and _labels(pod).get(names.POOL_LABEL) in rank
        and pod_ready(pod)
        and serves(pod) in (None, tenant)
    ]
    return sorted(
        free,
        key=lambda pod: (
            rank[_labels(pod)[names.POOL_LABEL]],
            str(pod["metadata"].get("creationTimestamp") or ""),
            str(pod["metadata"].get("name")),
        ),
    )


def claim_patch(pod: Manifest, owner: Manifest, owner_label: str) -> Manifest:
    """The one patch that claims `pod` for `owner` (an execution or a session), only if
    nobody changed it since it was read: claimed labels (`owner_label` names the owner), and
    the owner as its only (controlling) owner, so the pool stops counting it and garbage
    collection ties it to the owner."""
    meta = owner["metadata"]
    reference = kopf.build_owner_reference(kopf.Body(owner))  # type: ignore[arg-type]
    return {
        "metadata": {
            "resourceVersion": pod["metadata"]["resourceVersion"],
            "labels": {
                names.POOL_STATE_LABEL: names.POOL_CLAIMED,
                names.CLAIMED_BY_LABEL: meta["uid"],
                owner_label: meta["name"],
            },
            "ownerReferences": [reference],
        }
    }


def run_request(
    execution_uid: str,
    spec: CodeExecutionSpec,
    plan: Plan,
    settings: OperatorSettings,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The body of POST /v1/run: the same config as config.json (`extra_env`: what the
    serving pod was started with, a session's egress proxy variables), and the inputs."""
    return {
        "executionId": execution_uid,
        "config": build_runner_config(spec, plan, settings, extra_env),
        "source": spec.source,
        "stdin": spec.stdin,
        "files": [
            {
                "path": f.path,
                "content": f.content,
                **({"encoding": f.encoding} if f.encoding else {}),
            }
            for f in spec.files
        ],
    }


def parse_credential(head: bytes) -> str | None:
    """The credential from the runner's first log line, `{"serve":{..."credential":...}}`.
    Only a whole first line counts (the program writes after it, never before)."""
    end = head.find(b"\n")
    if end < 0:
        return None
    try:
        line = json.loads(head[:end])
    except ValueError:
        return None
    serve = line.get("serve") if isinstance(line, dict) else None
    credential = serve.get("credential") if isinstance(serve, dict) else None
    if isinstance(credential, str) and CREDENTIAL_PATTERN.match(credential):
        return credential
    return None


def runner_address(pod: Manifest) -> RunnerAddress | None:
    """Where the pod's runner listens: its IP and the port this operator gave it."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    port = names.RUNNER_PORT
    for container in (pod.get("spec") or {}).get("containers") or []:
        for declared in container.get("ports") or []:
            if declared.get("name") == names.RUNNER_PORT_NAME:
                port = int(declared.get("containerPort") or names.RUNNER_PORT)
    return RunnerAddress(host=str(ip), port=port)


def wait_ms(execution: Manifest, started_at: datetime) -> int:
    created = (execution.get("metadata") or {}).get("creationTimestamp")
    try:
        since = datetime.fromisoformat(str(created))
    except ValueError:
        return 0
    return max(0, int((started_at - since).total_seconds() * 1000))


def count_start(previous: Manifest, new: Manifest) -> None:
    """Metrics, once per execution: the status write that first names how it started."""
    mode = new.get("startMode")
    if mode and not previous.get("startMode") and new.get("waitMs") is not None:
        STARTS.labels(mode=mode).inc()
        WAITS.labels(mode=mode).observe(new["waitMs"] / 1000)


# --- claiming and running -----------------------------------------------------------------


@dataclass
class WarmPath:
    kube: KubeApi
    settings: OperatorSettings
    catalog: Catalog
    # Per pod uid: the runner's credential (read once from its log).
    credentials: dict[str, str] = field(default_factory=dict)
    # Per execution uid: the pod just claimed, handed to its serve daemon (saves a read).
    claimed: dict[str, Manifest] = field(default_factory=dict)
    # Executions whose last claim patch got no answer (it may have been applied).
    unsure: set[str] = field(default_factory=set)
    # Per execution uid: wall-clock times of its warm run's milestones in this process.
    marks: dict[str, dict[str, float]] = field(default_factory=dict)
    # Per execution id: who wants its output live (a direct run's caller).
    listeners: dict[str, OutputListener] = field(default_factory=dict)
    # Pool pods (uid) the direct path took in this process for a run in progress.
    reserved: set[str] = field(default_factory=set)
    # Per pool pod uid: the tenant whose runs it serves (its label is written behind).
    pinned: dict[str, str] = field(default_factory=dict)
    # Pool pods (uid) that take no further run (retiring, or refused one): never reserved.
    spent: set[str] = field(default_factory=set)
    # Set whenever a reserved pod is released: a run waiting for one looks again.
    released: asyncio.Event = field(default_factory=asyncio.Event)
    # Per pool pod uid: when the direct path last released it (monotonic seconds).
    last_released: dict[str, float] = field(default_factory=dict)
    # Pool pods (uid) whose tenant label this process has written.
    pins_written: set[str] = field(default_factory=set)
    # Runs (execution uids) this process started or re-attached to on a pool pod.
    attended: set[str] = field(default_factory=set)
    # (namespace, pod name) -> the executions whose status says they run there (the API's
    # word, ahead of this process's: after a restart, a pod whose run no one has re-attached
    # to yet takes no other run, which would push that run's records out of its runner).
    runs_recorded_on: Callable[[str, str], Iterable[str]] = lambda namespace, pod: ()
    _session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def claim(
        self,
        owner: Manifest,
        owner_label: str,
        wanted: Wanted | None,
        pools: list[Manifest],
        known_pods: list[Manifest] | None = None,
    ) -> Manifest | None:
        """A pod claimed for `owner` (earlier or now), or None: go cold. `known_pods` (the
        operator's index of pool pods) saves the list when it is fresh enough: a claim of a
        pod whose index entry is behind gets a 409, and then the pods are listed."""
        if not pools:
            return None
        meta = owner["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        if uid in self.claimed:
            return self.claimed[uid]  # claimed by this process, its status not yet written
        fitting = fitting_pools(wanted, pools, self.catalog, self.settings)
        # After an uncertain claim (its answer lost) only a fresh list shows what it did.
        sources = [known_pods] if known_pods is not None and uid not in self.unsure else []
        for pods in [*sources, None]:
            if pods is None:
                pods = await self.kube.list_pods(
                    namespace, label_selector=names.POOL_LABEL, uid=uid
                )
            earlier = earlier_claim(pods, uid)
            if earlier is not None:
                return earlier
            if not fitting:
                return None
            claimed = await self._claim_one(
                owner, owner_label, candidates(pods, fitting, tenant_of(owner), self.pinned)
            )
            if claimed is not None:
                return claimed
        POOL_MISSES.inc()
        self.marks.pop(uid, None)
        return None

    def reserve(
        self, wanted: Wanted | None, pools: list[Manifest], pods: list[Manifest], tenant: str
    ) -> Manifest | None:
        """The direct path's claim: a free ready pod that fits and serves `tenant` or no one
        yet, taken in this process at once (no API write; the claim and every other claimer
        of this process respect it) and from now on `tenant`'s."""
        # The pod released longest ago first: its runner has had the most time to prepare
        # the next run's box.
        servable = sorted(
            self._servable(wanted, pools, pods, tenant),
            key=lambda pod: self.last_released.get(str(pod["metadata"].get("uid")), 0.0),
        )
        for pod in servable:
            uid = str(pod["metadata"].get("uid"))
            if uid not in self.reserved:
                self.reserved.add(uid)
                self.pinned[uid] = tenant
                return pod
        return None

    async def reserve_within(
        self,
        wanted: Wanted | None,
        pools: list[Manifest],
        pods: list[Manifest],
        tenant: str,
        seconds: float,
    ) -> Manifest | None:
        """`reserve`, waiting up to `seconds` for one of the pods that serve runs now."""
        deadline = time.monotonic() + seconds
        while True:
            self.released.clear()
            pod = self.reserve(wanted, pools, pods, tenant)
            left = deadline - time.monotonic()
            if pod is not None or left <= 0 or not self._servable(wanted, pools, pods, tenant):
                return pod
            try:
                await asyncio.wait_for(self.released.wait(), timeout=left)
            except TimeoutError:
                return self.reserve(wanted, pools, pods, tenant)

    def _servable(
        self, wanted: Wanted | None, pools: list[Manifest], pods: list[Manifest], tenant: str
    ) -> list[Manifest]:
        """The pods that can serve this run now or once their run in progress ends."""
        fitting = fitting_pools(wanted, pools, self.catalog, self.settings)
        return [
            pod
            for pod in candidates(pods, fitting, tenant, self.pinned)
            if (uid := str(pod["metadata"].get("uid"))) not in self.spent
            and uid in self.credentials
            and not self._unattended_run_on(pod)
        ]

    def _unattended_run_on(self, pod: Manifest) -> bool:
        meta = pod["metadata"]
        recorded = self.runs_recorded_on(str(meta.get("namespace")), str(meta.get("name")))
        return any(uid not in self.attended for uid in recorded)

    async def take(
        self,
        wanted: Wanted | None,
        pools: list[Manifest],
        pods: list[Manifest] | None,
        tenant: str,
        namespace: str,
    ) -> Manifest | None:
        """A pool pod for one run of `tenant`: reserved in this process (waiting up to
        POOL_WAIT_SECONDS for one in use), its tenant label written before its first run.
        `pods`: the operator's index of pool pods; None (or an index that shows no pod to
        take) lists them afresh. None: no pod fits or is free (go cold)."""
        seconds = self.settings.pool_wait_seconds
        pod = await self.reserve_within(wanted, pools, pods or [], tenant, seconds)
        if pod is None and fitting_pools(wanted, pools, self.catalog, self.settings):
            listed = await self.kube.list_pods(namespace, label_selector=names.POOL_LABEL, uid=None)
            for found in listed:
                free = _labels(found).get(names.POOL_STATE_LABEL) == names.POOL_FREE
                if free and pod_ready(found):
                    await self.credential(found)
            pod = self.reserve(wanted, pools, listed, tenant)
        if pod is None or await self.pin(pod, tenant):
            return pod
        return None

    async def pin(self, pod: Manifest, tenant: str) -> bool:
        """Label the pod as `tenant`'s before its first run (a restarted operator hands it to
        no one else); False, and the pod released, when the label could not be written."""
        meta, uid = pod["metadata"], str(pod["metadata"].get("uid"))
        if _labels(pod).get(names.SERVES_TENANT_LABEL) == tenant or uid in self.pins_written:
            return True
        patch = {"metadata": {"labels": {names.SERVES_TENANT_LABEL: tenant}}}
        try:
            await self.kube.patch_pod(meta["namespace"], meta["name"], uid=None, patch=patch)
        except API_ERRORS as error:
            logger.warning("labelling pool pod %s with its tenant: %s", meta["name"], error)
            gone = isinstance(error, KubeError) and error.status == 404
            self.release(pod, serves_on=not gone)
            return False
        self.pins_written.add(uid)
        return True

    def reserve_for_reattach(self, pod: Manifest, execution_uid: str) -> None:
        """A run this process did not start (it restarted): its pod takes no other run
        until it has been re-attached to and released."""
        self.reserved.add(str(pod["metadata"].get("uid")))
        self.attended.add(execution_uid)

    async def remove(self, pod: Manifest) -> None:
        """Delete a pool pod that takes no further run (its pool starts another)."""
        meta = pod["metadata"]
        try:
            await self.kube.delete_pod(meta["namespace"], meta["name"], uid=None)
        except API_ERRORS as error:
            logger.warning("deleting pool pod %s after its last run: %s", meta["name"], error)

    def release(self, pod: Manifest, *, serves_on: bool) -> None:
        """End a direct run's hold on its pod: free for its tenant's next run, or spent."""
        uid = str(pod["metadata"].get("uid"))
        self.reserved.discard(uid)
        self.last_released[uid] = time.monotonic()
        if not serves_on:
            self.spent.add(uid)
        self.released.set()

    async def _claim_one(
        self, owner: Manifest, owner_label: str, pods: list[Manifest]
    ) -> Manifest | None:
        meta = owner["metadata"]
        taken = self.reserved | self.spent
        pods = [pod for pod in pods if str(pod["metadata"].get("uid")) not in taken]
        for pod in pods:
            try:
                claimed = await self.kube.patch_pod(
                    meta["namespace"],
                    pod["metadata"]["name"],
                    uid=meta["uid"],
                    patch=claim_patch(pod, owner, owner_label),
                )
            except KubeError as error:
                if error.status not in (404, 409):
                    self.unsure.add(meta["uid"])
                    raise
                CLAIM_CONFLICTS.inc()
                continue
            except Exception:
                self.unsure.add(meta["uid"])
                raise
            self.unsure.discard(meta["uid"])
            self.mark(meta["uid"], "claimed")
            return claimed
        return None

    def begin_marks(self, execution_uid: str) -> None:
        """Time this execution's warm run (a record-path session run is not timed)."""
        self.marks[execution_uid] = {"claiming": time.time()}

    def mark(self, execution_uid: str, milestone: str) -> None:
        if execution_uid in self.marks:
            self.marks[execution_uid].setdefault(milestone, time.time())

    def log_marks(self, execution: Manifest) -> None:
        """One log line with the run's milestones in this process (cheap, always on)."""
        meta = execution["metadata"]
        marks = self.marks.pop(meta["uid"], None)
        if marks:
            logger.info(
                "%s %s/%s %s", TIMINGS_LOG, meta["namespace"], meta["name"], json.dumps(marks)
            )

    @contextmanager
    def direct_marks(self, run_id: str) -> Iterator[None]:
        """Time a direct run (`run_id`: namespace/name) from its arrival to its answer and log
        one line with its milestones; a refused or failed run is left untimed."""
        self.marks[run_id] = {"received": time.time()}
        try:
            yield
        except BaseException:
            self.marks.pop(run_id, None)
            raise
        self.mark(run_id, "done")
        marks = self.marks.pop(run_id, None)
        if marks:
            logger.info("%s %s %s", DIRECT_TIMINGS_LOG, run_id, json.dumps(marks))

    @contextmanager
    def listening(self, run_id: str, listener: OutputListener | None) -> Iterator[None]:
        """`listener` sees the run's output as its runner sends it, while this lasts."""
        if listener is None:
            yield
            return
        self.listeners[run_id] = listener
        try:
            yield
        finally:
            self.listeners.pop(run_id, None)

    async def credential(self, pod: Manifest) -> str | None:
        pod_uid = str(pod["metadata"].get("uid"))
        if pod_uid not in self.credentials:
            head = await self.kube.read_log_head(
                pod["metadata"]["namespace"],
                pod["metadata"]["name"],
                uid=None,
                limit_bytes=CREDENTIAL_LINE_BYTES,
            )
            credential = parse_credential(head)
            if credential is None:
                return None
            self.credentials[pod_uid] = credential
        return self.credentials[pod_uid]

    def forget_if_gone(self, event_type: str | None, pod: Manifest) -> bool:
        """Forget a pod's credential with the pod; whether it is gone."""
        if event_type == "DELETED" or (pod.get("metadata") or {}).get("deletionTimestamp"):
            uid = str((pod.get("metadata") or {}).get("uid"))
            self.credentials.pop(uid, None)
            self.reserved.discard(uid)
            self.pinned.pop(uid, None)
            self.spent.discard(uid)
            self.last_released.pop(uid, None)
            self.pins_written.discard(uid)
            return True
        return False

    async def pool_pod_changed(self, event_type: str | None, pod: Manifest) -> None:
        """Read a free pod's credential as soon as it is ready (off a claim's critical path);
        forget it with the pod."""
        if self.forget_if_gone(event_type, pod):
            return
        if _labels(pod).get(names.POOL_STATE_LABEL) == names.POOL_FREE and pod_ready(pod):
            await self.credential(pod)

    async def run(
        self, pod: Manifest, request: dict[str, Any], *, seconds_left: float
    ) -> LogSummary:
        """Run (or re-attach to) the execution in its claimed pod: the verified answer.
        RunnerUnavailable when there is none; TimeoutError when `seconds_left` ran out."""
        address = runner_address(pod)
        credential = await self.credential(pod)
        if address is None or credential is None:
            RUNNER_FAILURES.labels(why="no credential").inc()
            raise RunnerUnavailable("no address or credential")
        try:
            async with asyncio.timeout(max(seconds_left, 0)):
                return await run(
                    self._client(),
                    address,
                    credential,
                    request,
                    tail_bytes=self.settings.status_output_bytes,
                    limit_bytes=self.settings.log_read_limit_bytes,
                    files_bytes=self.settings.outputs_stored_bytes,
                    marks=self.marks.get(str(request["executionId"])),
                    on_output=self.listeners.get(str(request["executionId"])),
                )
        except RunnerUnavailable as error:
            RUNNER_FAILURES.labels(why=error.why).inc()
            logger.warning("runner of pod %s: %s", pod["metadata"]["name"], error.why)
            raise

    async def cancel(self, pod: Manifest, execution_id: str) -> bool:
        """Stop the run of `execution_id` on the pod's runner (serving/runner.py cancel); False
        when it has none in progress or cannot be reached."""
        address = runner_address(pod)
        credential = await self.credential(pod)
        if address is None or credential is None:
            return False
        try:
            return await cancel(self._client(), address, credential, execution_id)
        except RunnerUnavailable as error:
            logger.warning("cancel on pod %s: %s", pod["metadata"]["name"], error.why)
            return False

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)
            )
        return self._session

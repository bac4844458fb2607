"""What the handlers do, in one place: start executions, follow their pods, record results.

Safe to run again at any point (operator restarts, duplicate events, the watchdog and the
pod handler racing): children have deterministic names and "already exists" is success
when the object that exists is this execution's own (its ownerReference has the uid); a
namesake that is not ends the execution with Error/ChildConflict and is never used. Status
is written with the object's resourceVersion as a precondition, so of two writers only one
moves the status, and a terminal status is final. Events are posted only by the writer
whose write made the transition.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import kopf
from pydantic import ValidationError
from sandpod_contract.catalog import Catalog, run_seconds
from sandpod_contract.models import (
    DEFAULT_TIMEOUT_SECONDS,
    BlockedEgress,
    CodeExecutionSpec,
    is_terminal,
    parse_time,
)
from sandpod_contract.names import (
    API_VERSION,
    CANCEL_ANNOTATION,
    EXECUTION_LABEL,
    FINISHED_LABEL,
    KIND,
    POOL_LABEL,
    SERVES_TENANT_LABEL,
    SESSION_LABEL,
    child_name,
)
from sandpod_contract.runner import LogSummary

from sandpod_operator.egress.proxy import (
    EgressProxy,
    ProxyClient,
    blocked_message,
    execution_grant,
)
from sandpod_operator.executions.builders import (
    InvalidSpecError,
    Plan,
    build_configmap,
    build_egress_policy,
    build_network_policy,
    build_outputs_configmap,
    build_pod,
    check_egress,
    plan_execution,
    plan_outputs,
)
from sandpod_operator.kube import (
    API_ERRORS,
    TRANSIENT_ERRORS,
    KubeApi,
    KubeError,
    LogRead,
    Manifest,
)
from sandpod_operator.owners import as_body, owned_by
from sandpod_operator.pools.warm import (
    WarmPath,
    count_start,
    execution_wants,
    tenant_of,
    wait_ms,
)
from sandpod_operator.serving.core import serve_once
from sandpod_operator.sessions.controller import SessionController
from sandpod_operator.settings import OperatorSettings
from sandpod_operator.status import (
    NodeRoom,
    NodeView,
    Verdict,
    accepted_summary,
    cancelled_on_request,
    next_status,
    node_step_at,
    observe_pod,
    past_deadline,
    pod_finished,
    pod_state_key,
    run_deadline,
    status_patch,
    supersedes,
    terminated_state,
)

logger = logging.getLogger(__name__)

# Status writes that keep losing the resourceVersion race give up (and are retried later).
MAX_WRITE_ATTEMPTS = 5
# The watchdog leaves a pod that just finished to the pod event handler for this long.
FINISHED_POD_HANDOFF = timedelta(seconds=5)
# A run a pool pod's runner refused is offered again (to another pod, or that one) this
# much later.
REFUSED_RUN_BACKOFF_SECONDS = 0.2
# The watchdog ends a warm run this long after its deadline if its serve daemon did not.
WARM_BACKSTOP = timedelta(seconds=10)
# The watchdog wakes this long after a deadline, so that it never looks just before it.
DEADLINE_SLACK_SECONDS = 0.05
# Marks a pod whose execution is final and which this process deleted.
FINAL = ("final",)
NORMAL_PHASES = frozenset({"Pending", "Running", "Succeeded", "Cancelled"})
STATUS_TOO_LARGE = "StatusTooLarge"


class EventPoster(Protocol):
    """Posts a Kubernetes Event about an object: kopf.event (kopf queues and sends it)."""

    def __call__(self, objs: kopf.Body, *, type: str, reason: str, message: str = "") -> None: ...


def now() -> datetime:
    return datetime.now(UTC)


def is_transient(error: Exception) -> bool:
    return isinstance(error, TRANSIENT_ERRORS) or (isinstance(error, KubeError) and error.transient)


def cancel_requested(execution: Mapping[str, Any]) -> bool:
    annotations = (execution.get("metadata") or {}).get("annotations") or {}
    return annotations.get(CANCEL_ANNOTATION) == "true"


def timeout_of(execution: Mapping[str, Any]) -> int:
    timeout = (execution.get("spec") or {}).get("timeoutSeconds")
    return timeout if isinstance(timeout, int) else DEFAULT_TIMEOUT_SECONDS


def too_large(error: KubeError) -> bool:
    """The API server or etcd refused a write for its size."""
    message = error.message.lower()
    return error.status == 413 or (
        error.status in (422, 500) and ("too large" in message or "too long" in message)
    )


def owner_uid(pod: Mapping[str, Any]) -> str | None:
    for owner in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == KIND and owner.get("apiVersion") == API_VERSION:
            return str(owner.get("uid"))
    return None


@dataclass
class Reconciler:
    kube: KubeApi
    settings: OperatorSettings
    catalog: Catalog
    post_event: EventPoster = kopf.event
    # Told (namespace, name) of each execution as soon as it is labelled finished (the
    # admission ledger, which must not wait for the watch to stop counting it).
    on_finished: Callable[[str, str], None] = lambda namespace, name: None
    # Per pod uid, the state last acted on (or FINAL), to skip pod events that change nothing.
    observations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Per node name, its allocatable resources: a sandbox larger than every node never queues.
    node_allocatable: dict[str, Manifest] = field(default_factory=dict)
    # Per node name, when a sandbox there last took a step toward its program (node_step_at).
    node_steps: dict[str, datetime] = field(default_factory=dict)
    warm: WarmPath = field(init=False)
    sessions: SessionController = field(init=False)
    # Per execution uid: its warm run, started in this process right after the claim (the
    # serve daemon waits for it instead of posting again), and the runs it finished.
    warm_runs: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    warm_done: set[str] = field(default_factory=set)
    # Per execution uid: its pool pod being taken (the early start's or the create
    # handler's, whichever came first): whether it started warm.
    warm_starts: dict[str, asyncio.Future[bool]] = field(default_factory=dict)
    # Executions whose cancel this process has seen (a run not posted yet is not posted).
    cancelling: set[str] = field(default_factory=set)
    # Per execution uid: the verdict of its warm run until it is recorded.
    warm_verdicts: dict[str, Verdict] = field(default_factory=dict)
    # namespace -> its SandboxPools, as the operator's index shows them.
    pools_in: Callable[[str], list[Manifest]] = lambda namespace: []
    proxy: ProxyClient | None = field(init=False)

    def on_node_event(self, event_type: str | None, node: Manifest) -> None:
        name = str((node.get("metadata") or {}).get("name"))
        if event_type == "DELETED":
            self.node_allocatable.pop(name, None)
        else:
            self.node_allocatable[name] = dict((node.get("status") or {}).get("allocatable") or {})

    def __post_init__(self) -> None:
        self.warm = WarmPath(self.kube, self.settings, self.catalog)
        self.proxy = (
            ProxyClient(self.kube, self.settings) if self.settings.egress_proxy_service else None
        )
        self.sessions = SessionController(
            self.kube,
            self.settings,
            self.catalog,
            self.warm,
            self.record,
            self.store_outputs,
            proxy=self.proxy,
        )

    async def close(self) -> None:
        for task in self.warm_runs.values():
            task.cancel()  # re-attached after a restart (same executionId)
        await self.warm.close()
        await self.kube.close()

    def forget(self, execution_uid: str) -> None:
        """An execution is gone: drop what this process kept about it."""
        self.kube.counter.forget(execution_uid)
        self.warm_done.discard(execution_uid)
        self.warm.marks.pop(execution_uid, None)
        self.warm.claimed.pop(execution_uid, None)
        self.warm.unsure.discard(execution_uid)
        self.warm.attended.discard(execution_uid)
        self.cancelling.discard(execution_uid)
        self.warm_verdicts.pop(execution_uid, None)
        self.warm_starts.pop(execution_uid, None)

    # --- starting -------------------------------------------------------------------------

    async def start_early(
        self, execution: Manifest, *, pools: list[Manifest], pool_pods: list[Manifest]
    ) -> None:
        """On an execution's first events, before kopf's own cycle (its finalizer) lets the
        create handler run: claim a pool pod and start the run if it can; anything else
        (no pool, no free pod, an invalid spec, a cancel) is left to the create handler."""
        meta = execution["metadata"]
        uid = meta["uid"]
        started = uid in self.warm_runs or uid in self.warm_done or uid in self.warm.claimed
        if not pools or execution.get("status") or started or meta.get("deletionTimestamp"):
            return
        if cancel_requested(execution):
            return
        try:
            spec = CodeExecutionSpec.model_validate(execution.get("spec") or {})
            plan = plan_execution(spec, self.catalog, self.settings)
        except (ValidationError, InvalidSpecError):
            return
        if spec.session is None:
            await self._start_warm(execution, spec, plan, pools, pool_pods)

    async def start(
        self,
        execution: Manifest,
        *,
        deny_all_present: bool,
        pools: list[Manifest] | None = None,
        session: Manifest | None = None,
        pool_pods: list[Manifest] | None = None,
    ) -> None:
        """on.create / on.resume: make sure an unfinished execution has its pod, once: one
        claimed from a fitting pool of its namespace (`pools`; `pool_pods`: the operator's
        index of their pods, when fresh enough), else one of its own. One that names a
        session (`session`: as last seen, if at all) waits for its turn there."""
        status = execution.get("status") or {}
        if is_terminal(status.get("phase")):
            return
        if cancel_requested(execution):
            await self.cancel(execution)
            return
        meta = execution["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        try:
            spec = CodeExecutionSpec.model_validate(execution.get("spec") or {})
            plan = plan_execution(spec, self.catalog, self.settings)
            check_egress(
                spec.network,
                self.settings.egress_bounds,
                namespace,
                proxy_configured=self.proxy is not None,
            )
        except (ValidationError, InvalidSpecError) as error:
            message = _spec_error_message(error)
            await self.record(
                execution,
                Verdict("Error", "InvalidSpec", message, retryable=False, finished_at=now()),
            )
            raise kopf.PermanentError(message) from error
        if spec.session is not None:
            await self.sessions.accept(execution, spec, session)
            return
        pod_name = child_name(name, uid)
        if status.get("startMode") == "warm" or uid in self.warm_runs or uid in self.warm_done:
            return  # its warm run is under way (or the serve daemon re-attaches to it)
        if status.get("podName"):
            # A pod was created before (this process or an earlier one): follow it, never
            # create a second one. If it is gone, the run is lost.
            pod = await self.kube.read_pod(namespace, pod_name, uid=uid)
            if pod is None or not owned_by(pod, uid):
                await self.record_lost(execution)
            else:
                await self.follow(execution, pod)
            return
        if await self._start_warm(execution, spec, plan, pools or [], pool_pods):
            return
        pod = await self._create_children(execution, spec, plan, deny_all_present)
        if pod is not None:
            await self.follow(execution, pod)

    async def _start_warm(
        self,
        execution: Manifest,
        spec: CodeExecutionSpec,
        plan: Plan,
        pools: list[Manifest],
        pool_pods: list[Manifest] | None,
    ) -> bool:
        """Take a pool pod of the execution's tenant, name it in the status, start the run:
        False when there is none to take (go cold). The early start and the create handler
        may both ask: the second waits for the first's answer."""
        uid = execution["metadata"]["uid"]
        if uid not in self.warm_starts:
            starting = self._take_and_start(execution, spec, plan, pools, pool_pods)
            self.warm_starts[uid] = asyncio.ensure_future(starting)
        task = self.warm_starts[uid]
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self.warm_starts.pop(uid, None)

    async def _take_and_start(
        self,
        execution: Manifest,
        spec: CodeExecutionSpec,
        plan: Plan,
        pools: list[Manifest],
        pool_pods: list[Manifest] | None,
    ) -> bool:
        meta = execution["metadata"]
        self.warm.begin_marks(meta["uid"])
        wanted, tenant = execution_wants(spec, plan), tenant_of(execution)
        pod = await self.warm.take(wanted, pools, pool_pods, tenant, meta["namespace"])
        if pod is None:
            self.warm.marks.pop(meta["uid"], None)
            return False
        self.warm.mark(meta["uid"], "claimed")
        written = await self._record_claim(execution, pod)
        if written is not None:
            self._serve_soon(written)
        return True

    async def _create_children(
        self, execution: Manifest, spec: CodeExecutionSpec, plan: Plan, deny_all_present: bool
    ) -> Manifest | None:
        meta = execution["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if not deny_all_present:
            await self.kube.create_network_policy(build_network_policy(namespace), uid=uid)
        proxy, proxy_variables = await self._proxy_for(spec, plan, namespace, uid)
        egress = build_egress_policy(
            namespace=namespace,
            execution_name=name,
            uid=uid,
            network=spec.network,
            bounds=self.settings.egress_bounds,
            proxy=proxy,
        )
        if egress is not None:
            kopf.adopt(egress, owner=as_body(execution))
            found = await self.kube.create_network_policy(egress, uid=uid)
            await self._own(execution, egress, found)
        configmap = build_configmap(
            namespace=namespace,
            execution_name=name,
            uid=uid,
            spec=spec,
            plan=plan,
            settings=self.settings,
            extra_env=proxy_variables,
        )
        kopf.adopt(configmap, owner=as_body(execution))
        await self._own(execution, configmap, await self.kube.create_configmap(configmap, uid=uid))
        pod = build_pod(
            namespace=namespace, execution_name=name, uid=uid, plan=plan, settings=self.settings
        )
        kopf.adopt(pod, owner=as_body(execution))
        try:
            created = await self.kube.create_pod(pod, uid=uid)
        except KubeError as error:
            if error.transient:
                raise
            verdict = _pod_refused(error, plan)
            await self.record(execution, verdict)
            raise kopf.PermanentError(verdict.message) from error
        # Already there, it is ours when an earlier attempt created it and did not record it.
        return await self._own(execution, pod, created)

    async def _proxy_for(
        self, spec: CodeExecutionSpec, plan: Plan, namespace: str, uid: str
    ) -> tuple[EgressProxy | None, dict[str, str]]:
        """The egress proxy and the sandbox's variables for it, when the allowlist names hosts."""
        if self.proxy is None or not spec.network.host_rules:
            return None, {}
        grant = execution_grant(
            spec.network,
            namespace=namespace,
            uid=uid,
            timeout_seconds=plan.run_seconds,
            now=time.time(),
            startup=self.settings.pod_startup_timeout_seconds,
        )
        return await self.proxy.access(grant)

    async def _blocked_for(self, execution: Manifest, verdict: Verdict) -> list[BlockedEgress]:
        """When an execution with host entries ends: what the proxy refused for it (best
        effort: a proxy that does not answer never holds up or fails the run)."""
        network = (execution.get("spec") or {}).get("network") or {}
        if self.proxy is None or not is_terminal(verdict.phase):
            return []
        if not any("host" in entry for entry in network.get("allow") or []):
            return []
        return await self.proxy.blocked(execution["metadata"]["uid"])

    async def _own(self, execution: Manifest, wanted: Manifest, found: Manifest | None) -> Manifest:
        """The child as the cluster has it, if it is this execution's. A namesake that is not
        (made by someone else, for whatever purpose) ends the execution and is left alone."""
        kind, name = wanted["kind"], wanted["metadata"]["name"]
        if found is None:
            raise kopf.TemporaryError(f"{kind} {name} vanished while being created", delay=1)
        if owned_by(found, execution["metadata"]["uid"]):
            return found
        verdict = Verdict(
            "Error",
            "ChildConflict",
            f"a {kind} named {name} already exists and does not belong to this execution; "
            "it was left alone and nothing was run",
            retryable=False,
            finished_at=now(),
        )
        await self.record(execution, verdict)
        raise kopf.PermanentError(verdict.message)

    # --- following ------------------------------------------------------------------------

    async def on_pod_event(self, event_type: str | None, pod: Manifest) -> None:
        """A sandbox pod changed (or is gone): bring its execution's status up to date."""
        self._note_node_step(pod)
        meta = pod.get("metadata") or {}
        session = (meta.get("labels") or {}).get(SESSION_LABEL)
        if session:
            # A session's pod: its daemon looks at it (ready, or gone).
            self.sessions.wakeups.poke((str(meta.get("namespace")), session))
            self.warm.forget_if_gone(event_type, pod)
            return
        if POOL_LABEL in (meta.get("labels") or {}):
            # A pool pod: its run is the serve daemon's; its kubelet status says nothing.
            await self.warm.pool_pod_changed(event_type, pod)
            return
        namespace, pod_uid = meta.get("namespace"), str(meta.get("uid"))
        execution_name = (meta.get("labels") or {}).get(EXECUTION_LABEL)
        execution_uid = owner_uid(pod)
        if not namespace or not execution_name or not execution_uid:
            return
        seen = self.observations.get(pod_uid)
        if event_type == "DELETED":
            self.observations.pop(pod_uid, None)
            if seen == FINAL:
                return
        elif seen == FINAL or (seen == pod_state_key(pod) and not meta.get("deletionTimestamp")):
            return
        execution = await self.kube.get_execution(namespace, execution_name, uid=execution_uid)
        if execution is None or execution["metadata"].get("uid") != execution_uid:
            # Its execution is gone: the garbage collector would remove the pod; be quicker.
            if event_type != "DELETED" and not meta.get("deletionTimestamp"):
                await self.kube.delete_pod(namespace, meta["name"], uid=None)
            return
        if execution["metadata"].get("deletionTimestamp"):
            return  # on its way out: its pod goes with it (stop_deleted_execution)
        if event_type == "DELETED":
            if not is_terminal((execution.get("status") or {}).get("phase")):
                await self.record_lost(execution)
            return
        await self.follow(execution, pod)

    async def follow(self, execution: Manifest, pod: Manifest) -> None:
        """Record what the pod says; once the execution is final, remove the pod."""
        status = execution.get("status") or {}
        meta = execution["metadata"]
        pod_meta = pod.get("metadata") or {}
        if is_terminal(status.get("phase")):
            if not pod_meta.get("deletionTimestamp"):
                await self.kube.delete_pod(meta["namespace"], pod_meta["name"], uid=None)
            self.observations[str(pod_meta.get("uid"))] = FINAL
            return
        if pod_meta.get("deletionTimestamp") and not pod_finished(pod):
            # Someone else is deleting the pod of a running execution (this operator only
            # deletes pods of finished ones): its result is lost.
            await self.record_lost(execution)
            self.observations[str(pod_meta.get("uid"))] = FINAL
            return
        verdict = _started_cold(execution, await self.judge(execution, pod))
        verdict = await self.store_outputs(execution, verdict)
        await self.record(execution, verdict, pod_name=pod_meta["name"])
        if verdict.terminal:
            await self.kube.delete_pod(meta["namespace"], pod_meta["name"], uid=meta["uid"])
        # Later events that show this same state (or the deletion we caused) need no look.
        self.observations[str(pod_meta.get("uid"))] = (
            FINAL if verdict.terminal else pod_state_key(pod)
        )

    def _note_node_step(self, pod: Manifest) -> None:
        step = node_step_at(pod)
        if step is not None:
            node, at = step
            self.node_steps[node] = max(at, self.node_steps.get(node, at))

    def _observe(self, execution: Manifest, pod: Manifest, log: LogSummary | None) -> Verdict:
        """observe_pod with this execution's mode and timeout, now, the cluster's room and
        its node's last step."""
        return observe_pod(
            pod,
            log=log,
            mode=str((execution.get("spec") or {}).get("mode") or "run"),
            timeout_seconds=self.run_seconds_of(execution),
            now=now(),
            settings=self.settings,
            nodes=NodeView(
                largest=NodeRoom.largest(self.node_allocatable.values()),
                last_step=self.node_steps.get(str((pod.get("spec") or {}).get("nodeName"))),
            ),
        )

    async def judge(self, execution: Manifest, pod: Manifest) -> Verdict:
        """The verdict for a pod, reading its log (and events) only when that adds to it."""
        meta = execution["metadata"]
        log = None
        # The log is read only to verify a summary the runner's exit vouches for: without
        # one it holds nothing that may be believed.
        summary = accepted_summary(pod)
        if summary is not None:
            try:
                log = await self.kube.read_pod_log(
                    LogRead(
                        meta["namespace"],
                        pod["metadata"]["name"],
                        uid=meta["uid"],
                        summary=summary,
                        tail_bytes=self.settings.status_output_bytes,
                        limit_bytes=self.settings.log_read_limit_bytes,
                        files_bytes=self.settings.outputs_stored_bytes,
                    ),
                )
            except (KubeError, *TRANSIENT_ERRORS) as error:
                # The termination message still has the result; only the output tails are lost.
                logger.warning("no log for pod %s: %s", pod["metadata"]["name"], error)
        verdict = self._observe(execution, pod, log)
        if verdict.reason == "StartupTimeout" and not pod_finished(pod):
            warning = await self.kube.latest_warning(
                meta["namespace"], pod["metadata"]["name"], uid=meta["uid"]
            )
            if warning:
                verdict = replace(verdict, message=f"{verdict.message}; {warning}")
        return verdict

    async def watch(
        self, execution: Manifest, pods: list[Manifest], session: Manifest | None = None
    ) -> None:
        """Watchdog tick for an unfinished execution: time-based verdicts and lost pods."""
        status = execution.get("status") or {}
        if is_terminal(status.get("phase")):
            return
        if (execution.get("spec") or {}).get("session"):
            # Its session's daemon runs it; this only ends what that daemon cannot.
            await self.sessions.check(execution, session)
            await self._warm_backstop(execution)
            return
        if not status.get("podName"):
            return  # not started yet: the create handler (with kopf's retries) owns that
        if status.get("startMode") == "warm":
            await self._warm_backstop(execution)
            return
        meta = execution["metadata"]
        pod = next((p for p in pods if owner_uid(p) == meta["uid"]), None)
        if pod is None:
            pod = await self.kube.read_pod(meta["namespace"], status["podName"], uid=meta["uid"])
            if pod is None or not owned_by(pod, meta["uid"]):
                await self.record_lost(execution)
                return
        if pod_finished(pod):
            finished = parse_time((terminated_state(pod) or {}).get("finishedAt"))
            if finished is not None and now() - finished < FINISHED_POD_HANDOFF:
                return
            await self.follow(execution, pod)
            return
        verdict = self._observe(execution, pod, None)
        if verdict.terminal:
            # The index may lag behind the pod (it may have just finished): look again.
            fresh = await self.kube.read_pod(
                meta["namespace"], pod["metadata"]["name"], uid=meta["uid"]
            )
            if fresh is None or not owned_by(fresh, meta["uid"]):
                await self.record_lost(execution)
                return
            await self.follow(execution, fresh)
        elif verdict.phase != status.get("phase"):
            await self.follow(execution, pod)

    def run_seconds_of(self, execution: Manifest) -> int:
        """The execution's run time (its timeout, and its build's limit when it builds), which
        the operator's deadlines count from."""
        spec = execution.get("spec") or {}
        timeout = timeout_of(execution)
        language = self.catalog.languages.get(str(spec.get("language")))
        if language is None:
            return timeout
        mode = str(spec.get("mode") or "run")
        return run_seconds(language, mode, timeout, self.settings.compile_timeout_seconds)

    def next_check_in(self, execution: Manifest) -> float:
        """Seconds until the watchdog should look at an unfinished execution: its interval,
        or sooner, just after the program's deadline."""
        interval = self.settings.watchdog_interval_seconds
        started = parse_time((execution.get("status") or {}).get("startedAt"))
        if started is None:
            return interval
        deadline = run_deadline(started, self.run_seconds_of(execution), self.settings)
        until = (deadline - now()).total_seconds() + DEADLINE_SLACK_SECONDS
        return until if 0 < until < interval else interval

    async def store_outputs(self, execution: Manifest, verdict: Verdict) -> Verdict:
        """Put the verified output files of a final verdict into the execution's ConfigMap
        `<child>-outputs` (within the stored limit) and list them in the verdict. A namesake
        that is not this execution's ends it with ChildConflict, as any other child does."""
        if not verdict.files:
            return verdict
        meta = execution["metadata"]
        entries = plan_outputs(verdict.files, self.settings.outputs_stored_bytes)
        configmap = build_outputs_configmap(
            namespace=meta["namespace"],
            execution_name=meta["name"],
            uid=meta["uid"],
            files=verdict.files,
            entries=entries,
        )
        if configmap is not None:
            kopf.adopt(configmap, owner=as_body(execution))
            try:
                found = await self.kube.create_configmap(configmap, uid=meta["uid"])
            except KubeError as error:
                if error.transient:
                    raise
                logger.warning("outputs of %s not stored: %s", meta["name"], error)
                entries = [{**entry, "stored": False, "key": None} for entry in entries]
            else:
                if found is None:
                    raise kopf.TemporaryError("the outputs ConfigMap vanished", delay=1)
                if not owned_by(found, meta["uid"]):
                    return _child_conflict(configmap, verdict)
        stored = configmap["metadata"]["name"] if configmap is not None else None
        if not any(entry["stored"] for entry in entries):
            stored = None
        return replace(verdict, files=(), outputs=entries, outputs_config_map=stored)

    # --- warm: a pod claimed from a pool -----------------------------------------------

    async def _record_claim(self, execution: Manifest, pod: Manifest) -> Manifest | None:
        """The status names the pod before the program runs there (a restarted operator
        re-attaches to it). The execution as written, or None (the pod released) when
        another writer moved its status first."""
        started = now()
        verdict = Verdict(
            "Running",
            "Started",
            "the program runs in a ready pod from a pool",
            started_at=started,
            start_mode="warm",
            wait_ms=wait_ms(execution, started),
        )
        meta = execution["metadata"]
        self.warm.attended.add(meta["uid"])
        try:
            written = await self.record(execution, verdict, pod_name=pod["metadata"]["name"])
        except BaseException:
            self.warm.release(pod, serves_on=True)
            raise
        if written is None:
            self.warm.release(pod, serves_on=True)
            return None
        self.warm.claimed[meta["uid"]] = pod
        self.warm.mark(meta["uid"], "running")
        return written

    def _serve_soon(self, execution: Manifest) -> None:
        """Run the claimed execution now, beside kopf's handlers (a kopf daemon would start
        only once the status write comes back as an event)."""
        uid = execution["metadata"]["uid"]
        self.warm_runs[uid] = asyncio.create_task(self._serve(execution), name=f"warm run {uid}")

    async def _serve(self, execution: Manifest) -> bool:
        """The warm run as a task: True once its result is recorded. On an API error the
        serve daemon (kopf's retries) takes over and re-attaches."""
        uid = execution["metadata"]["uid"]
        try:
            await self._run_warm_now(execution)
        except (*API_ERRORS, kopf.TemporaryError) as error:
            logger.warning("warm run of %s: %s", execution["metadata"]["name"], error)
            return False
        finally:
            self.warm_runs.pop(uid, None)
        self.warm_done.add(uid)
        return True

    async def run_warm(self, execution: Manifest) -> None:
        """The serve daemon: wait for the run this process started, or (after a restart, or
        when that run failed to record) run or re-attach to the program in its claimed pod."""
        uid = execution["metadata"]["uid"]
        task = self.warm_runs.get(uid)
        if task is not None and await asyncio.shield(task):
            return
        if uid in self.warm_done:
            return
        await self._run_warm_now(execution)

    async def _run_warm_now(self, execution: Manifest) -> None:
        """Run (or re-attach to) the program in its pool pod and record the runner's verified
        result (never the kubelet's). A verdict this process has but could not record is
        recorded again, never run again."""
        status = execution.get("status") or {}
        meta = execution["metadata"]
        if is_terminal(status.get("phase")) or status.get("startMode") != "warm":
            return
        verdict = self.warm_verdicts.get(meta["uid"]) or await self._serve_in_pool(execution)
        if verdict is None:
            return
        verdict = await self.store_outputs(execution, verdict)
        await self.record(execution, verdict)
        self.warm_verdicts.pop(meta["uid"], None)
        self.warm.mark(meta["uid"], "recorded")
        self.warm.log_marks(execution)

    async def _serve_in_pool(self, execution: Manifest) -> Verdict | None:
        """The run's verdict from its pool pod's runner (another pod's, if that one's runner
        refused it); the pods that serve no more are deleted (their pools start others). None
        when there is nothing to record here (the pod is lost: recorded; or a cancel came
        first, which records)."""
        meta, status = execution["metadata"], execution.get("status") or {}
        pod = self.warm.claimed.pop(meta["uid"], None) or await self._pod_to_re_attach(execution)
        if pod is None:
            await self.record_lost(execution)
            return None
        spec = CodeExecutionSpec.model_validate(execution.get("spec") or {})
        plan = plan_execution(spec, self.catalog, self.settings)
        first_started = parse_time(status.get("startedAt")) or now()
        while True:
            if meta["uid"] in self.cancelling:
                self.warm.release(pod, serves_on=True)
                return None
            started = parse_time(status.get("startedAt")) or now()
            answer = await serve_once(
                self.warm, pod, meta["uid"], spec, plan, started, self.settings
            )
            self.warm.release(pod, serves_on=answer.serves_on)
            if not answer.serves_on:
                await self.warm.remove(pod)
            # A runner that did not start it (busy with a run this process does not know of,
            # or retired) leaves it to another pod, or to this one once free, until its
            # deadline.
            if not answer.refused or now() >= run_deadline(
                first_started, plan.run_seconds, self.settings
            ):
                break
            await asyncio.sleep(REFUSED_RUN_BACKOFF_SECONDS)
            taken = await self._another_pod(execution, spec, plan)
            if taken is None:
                break
            execution, pod = taken
            status = execution.get("status") or {}
        self.warm_verdicts[meta["uid"]] = answer.verdict
        return answer.verdict

    async def _pod_to_re_attach(self, execution: Manifest) -> Manifest | None:
        """The pod the status names, after a restart: run there only if it is a pool pod of
        the execution's tenant (or, from before pods served many runs, one it owns)."""
        meta, status = execution["metadata"], execution.get("status") or {}
        pod = await self.kube.read_pod(meta["namespace"], status["podName"], uid=meta["uid"])
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return None
        labels = pod["metadata"].get("labels") or {}
        serves = labels.get(SERVES_TENANT_LABEL) == tenant_of(execution)
        if not (serves and POOL_LABEL in labels) and not owned_by(pod, meta["uid"]):
            return None
        self.warm.reserve_for_reattach(pod, meta["uid"])
        return pod

    async def _another_pod(
        self, execution: Manifest, spec: CodeExecutionSpec, plan: Plan
    ) -> tuple[Manifest, Manifest] | None:
        """Another pool pod for a run that was refused, named in the status before the run."""
        namespace = execution["metadata"]["namespace"]
        wanted, tenant = execution_wants(spec, plan), tenant_of(execution)
        pod = await self.warm.take(wanted, self.pools_in(namespace), None, tenant, namespace)
        if pod is None:
            return None
        written = await self._record_claim(execution, pod)
        if written is None:
            return None
        return written, self.warm.claimed.pop(execution["metadata"]["uid"])

    async def _warm_backstop(self, execution: Manifest) -> None:
        """A warm run whose serve daemon did not end it well past its deadline."""
        status, meta = execution.get("status") or {}, execution["metadata"]
        started = parse_time(status.get("startedAt"))
        if started is None:
            return
        timeout = self.run_seconds_of(execution)
        if now() < run_deadline(started, timeout, self.settings) + WARM_BACKSTOP:
            return
        moved = await self.record(execution, past_deadline(started, timeout, now()))
        if moved and not status.get("session"):  # a session's pod stays with the session
            await self.kube.delete_pod(meta["namespace"], status["podName"], uid=meta["uid"])

    # --- ending ---------------------------------------------------------------------------

    async def cancel(self, execution: Manifest) -> None:
        status = execution.get("status") or {}
        if is_terminal(status.get("phase")):
            return
        meta = execution["metadata"]
        # A run on its session's runner is stopped there; its session records the answer.
        if status.get("session") and await self.sessions.cancel(meta["uid"]):
            return
        in_pool = status.get("startMode") == "warm" and not status.get("session")
        if in_pool:
            self.cancelling.add(meta["uid"])
            if await self._stop_pool_run(execution):
                return  # its runner stops it; its serve task records the answer
        finished = now()
        started = parse_time(status.get("startedAt"))
        duration = int((finished - started).total_seconds() * 1000) if started else None
        verdict = cancelled_on_request(finished_at=finished, duration_ms=duration)
        await self.record(execution, verdict)
        # A pool pod serves its tenant's next run; a pod of its own goes.
        if status.get("podName") and not status.get("session") and not in_pool:
            await self.kube.delete_pod(meta["namespace"], status["podName"], uid=meta["uid"])

    async def stop_deleted_pool_run(self, namespace: str, uid: str, pod_name: str) -> None:
        """An execution deleted while it may still run on its pool pod: stop it there."""
        pod = await self.kube.read_pod(namespace, pod_name, uid=uid)
        if pod is not None:
            await self.warm.cancel(pod, uid)

    async def _stop_pool_run(self, execution: Manifest) -> bool:
        """Stop the run in progress on its pool pod's runner: whether there was one."""
        meta, status = execution["metadata"], execution.get("status") or {}
        pod = self.warm.claimed.get(meta["uid"]) or await self.kube.read_pod(
            meta["namespace"], status["podName"], uid=meta["uid"]
        )
        return pod is not None and await self.warm.cancel(pod, meta["uid"])

    async def record_lost(self, execution: Manifest) -> None:
        await self.record(
            execution,
            Verdict(
                "Error",
                "PodLost",
                "the sandbox pod disappeared before it reported a "
                "result; the program did not run again",
                retryable=True,
                finished_at=now(),
            ),
        )

    async def mark_finished(self, execution: Manifest) -> None:
        """Label a finished execution, so the gateway counts unfinished ones from metadata
        alone. Also called for every finished execution the operator sees (restart-safe)."""
        meta = execution["metadata"]
        if (meta.get("labels") or {}).get(FINISHED_LABEL) == "true":
            return  # the ledger's index has seen the label already
        await self.kube.label_finished(meta["namespace"], meta["name"], uid=meta["uid"])
        self.on_finished(meta["namespace"], meta["name"])

    async def _try_mark_finished(self, execution: Manifest) -> None:
        # The finished-executions daemon labels what this misses.
        try:
            await self.mark_finished(execution)
        except API_ERRORS as error:
            logger.warning("could not label %s finished: %s", execution["metadata"]["name"], error)

    async def expire(self, execution: Manifest) -> None:
        meta = execution["metadata"]
        await self.kube.delete_execution(meta["namespace"], meta["name"], uid=meta["uid"])

    def ttl_remaining(self, execution: Manifest) -> float:
        """Seconds until a finished execution is due for deletion (0 when due)."""
        status = execution.get("status") or {}
        ttl = (execution.get("spec") or {}).get("ttlSecondsAfterFinished")
        ttl = self.settings.default_ttl_seconds if ttl is None else int(ttl)
        finished = parse_time(status.get("finishedAt")) or now()
        return max(0.0, (finished + timedelta(seconds=ttl) - now()).total_seconds())

    # --- writing status -------------------------------------------------------------------

    async def record(
        self,
        execution: Manifest,
        verdict: Verdict,
        *,
        pod_name: str | None = None,
        egress_blocked: list[BlockedEgress] | None = None,
    ) -> Manifest | None:
        """Write the verdict into status (compare-and-swap): the execution as written, None if
        this call did not move it. `egress_blocked`: what the proxy refused the run, when the
        caller knows (a run in a session); else an execution with host entries asks the proxy
        when it ends."""
        meta = execution["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        current: Manifest | None = execution
        blocked = egress_blocked
        for _ in range(MAX_WRITE_ATTEMPTS):
            if current is None or current["metadata"].get("uid") != uid:
                return None
            previous = current.get("status") or {}
            if not supersedes(verdict, previous):
                return None
            if blocked is None:
                blocked = await self._blocked_for(execution, verdict)
            new = next_status(
                previous,
                verdict,
                generation=current["metadata"].get("generation"),
                pod_name=pod_name,
                now=now(),
                egress_blocked=blocked,
            )
            patch = status_patch(previous, new)
            if not patch:
                return None
            try:
                written = await self.kube.patch_execution_status(
                    namespace,
                    name,
                    uid=uid,
                    resource_version=current["metadata"]["resourceVersion"],
                    status=patch,
                )
            except KubeError as error:
                if error.status == 404:
                    return None
                if too_large(error) and verdict.reason != STATUS_TOO_LARGE:
                    verdict = _without_result(verdict)
                    continue
                if error.status != 409:
                    raise
                current = await self.kube.get_execution(namespace, name, uid=uid)
                continue
            self._announce(current, previous, new)
            if is_terminal(new["phase"]):
                await self._try_mark_finished(current)
            if blocked:
                message = blocked_message(blocked)
                self.post_event(
                    as_body(current), type="Warning", reason="EgressBlocked", message=message
                )
            return written
        raise kopf.TemporaryError(f"status of {namespace}/{name} kept changing", delay=1)

    def _announce(self, execution: Manifest, previous: Manifest, new: Manifest) -> None:
        count_start(previous, new)
        phase = new["phase"]
        if previous.get("phase") == phase:
            return
        message = f"{new.get('reason')}: {new.get('message', '')}".rstrip(": ")
        self.post_event(
            as_body(execution),
            type="Normal" if phase in NORMAL_PHASES else "Warning",
            reason=phase,
            message=message,
        )
        if is_terminal(phase):
            meta = execution["metadata"]
            requests = self.kube.counter.settle(meta["uid"])
            logger.info(
                "execution %s/%s: %s (%s) after %d operator API requests",
                meta["namespace"],
                meta["name"],
                phase,
                new.get("reason"),
                requests,
            )


def _child_conflict(wanted: Manifest, verdict: Verdict) -> Verdict:
    """The run ended, but its outputs' ConfigMap name is taken by someone else's object."""
    return Verdict(
        "Error",
        "ChildConflict",
        f"a {wanted['kind']} named {wanted['metadata']['name']} already exists and does not "
        "belong to this execution; it was left alone and the program's output files were "
        "not stored",
        retryable=False,
        started_at=verdict.started_at,
        finished_at=verdict.finished_at or now(),
        duration_ms=verdict.duration_ms,
        start_mode=verdict.start_mode,
        wait_ms=verdict.wait_ms,
    )


def _without_result(verdict: Verdict) -> Verdict:
    """What is written when the API server refuses a status for its size: a small final
    status that says so (no output, nothing the program chose)."""
    return Verdict(
        "Error",
        STATUS_TOO_LARGE,
        "the result did not fit in the execution's status and was dropped",
        retryable=False,
        started_at=verdict.started_at,
        finished_at=verdict.finished_at or now(),
        duration_ms=verdict.duration_ms,
    )


def _started_cold(execution: Manifest, verdict: Verdict) -> Verdict:
    """A verdict about the execution's own pod, with how (and once known, how long) it
    waited to start."""
    status = execution.get("status") or {}
    waited = None
    if verdict.started_at is not None and status.get("waitMs") is None:
        waited = wait_ms(execution, verdict.started_at)
    return replace(verdict, start_mode="cold", wait_ms=waited)


def _spec_error_message(error: ValidationError | InvalidSpecError) -> str:
    if isinstance(error, InvalidSpecError):
        return str(error)
    problems = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"])
        problems.append(f"spec.{where}: {problem['msg']}")
    return "; ".join(problems)


def _pod_refused(error: KubeError, plan: Plan) -> Verdict:
    if "RuntimeClass" in error.message:
        return Verdict(
            "Error",
            "RuntimeClassNotFound",
            f"RuntimeClass {plan.runtime_class_name!r} is not installed in the cluster "
            f"({error.message})",
            retryable=False,
            finished_at=now(),
        )
    return Verdict(
        "Error",
        "PodRejected",
        f"the API server refused the sandbox pod: {error.message}",
        retryable=error.status == 403,
        finished_at=now(),
    )

"""What the handlers do, in one place: start executions, follow their pods, record results.

Safe to run again at any point (operator restarts, duplicate events, the watchdog and the
pod handler racing): children have deterministic names and "already exists" is success
when the object that exists is this execution's own (its ownerReference has the uid); a
namesake that is not ends the execution with Error/ChildConflict and is never used. Status
is written with the object's resourceVersion as a precondition, so of two writers only one
moves the status, and a terminal status is final. Events are posted only by the writer
whose write made the transition.
"""

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast

import aiohttp
import kopf
from pydantic import ValidationError
from sandpod_contract.catalog import Catalog
from sandpod_contract.models import (
    DEFAULT_TIMEOUT_SECONDS,
    BlockedEgress,
    CodeExecutionSpec,
    is_terminal,
)
from sandpod_contract.names import (
    API_VERSION,
    CANCEL_ANNOTATION,
    EXECUTION_LABEL,
    FINISHED_LABEL,
    KIND,
    POOL_LABEL,
    child_name,
)

from sandpod_operator.builders import (
    InvalidSpecError,
    Plan,
    build_configmap,
    build_egress_policy,
    build_network_policy,
    build_pod,
    check_egress,
    plan_execution,
)
from sandpod_operator.egress_proxy import (
    EgressProxy,
    ProxyClient,
    blocked_message,
    execution_grant,
    proxy_env,
)
from sandpod_operator.kube import KubeApi, KubeError
from sandpod_operator.runner_client import RunnerUnavailable
from sandpod_operator.settings import OperatorSettings
from sandpod_operator.status import (
    NodeRoom,
    Verdict,
    accepted_summary,
    next_status,
    observe_pod,
    observe_served,
    parse_time,
    pod_finished,
    pod_state_key,
    run_deadline,
    status_patch,
    supersedes,
    terminated_state,
    timed_out_by_platform,
)
from sandpod_operator.warm import WarmPath, count_start, run_request, wait_ms

Manifest = dict[str, Any]

logger = logging.getLogger(__name__)

# Status writes that keep losing the resourceVersion race give up (and are retried later).
MAX_WRITE_ATTEMPTS = 5
# The watchdog leaves a pod that just finished to the pod event handler for this long.
FINISHED_POD_HANDOFF = timedelta(seconds=5)
# The watchdog ends a warm run this long after its deadline if its serve daemon did not.
WARM_BACKSTOP = timedelta(seconds=10)
# The watchdog wakes this long after a deadline, so that it never looks just before it.
DEADLINE_SLACK_SECONDS = 0.05
# Marks a pod whose execution is final and which this process deleted.
FINAL = ("final",)
NORMAL_PHASES = frozenset({"Pending", "Running", "Succeeded", "Cancelled"})
TRANSIENT_ERRORS = (aiohttp.ClientError, TimeoutError)
STATUS_TOO_LARGE = "StatusTooLarge"
API_ERRORS = (KubeError, *TRANSIENT_ERRORS)


class EventPoster(Protocol):
    """Posts a Kubernetes Event about an object: kopf.event (kopf queues and sends it)."""

    def __call__(self, objs: kopf.Body, *, type: str, reason: str, message: str = "") -> None: ...


def as_body(manifest: Manifest) -> kopf.Body:
    """A kopf view of a plain object, for kopf.adopt and kopf.event."""
    return kopf.Body(cast(kopf.RawBody, manifest))


def now() -> datetime:
    return datetime.now(UTC)


def is_transient(error: Exception) -> bool:
    return isinstance(error, TRANSIENT_ERRORS) or (isinstance(error, KubeError) and error.transient)


def cancel_requested(execution: Mapping[str, Any]) -> bool:
    annotations = (execution.get("metadata") or {}).get("annotations") or {}
    return annotations.get(CANCEL_ANNOTATION) == "true"


def owned_by(child: Mapping[str, Any], uid: str) -> bool:
    """Whether a child carries this execution's ownerReference."""
    owners = (child.get("metadata") or {}).get("ownerReferences") or []
    return any(
        owner.get("kind") == KIND
        and owner.get("apiVersion") == API_VERSION
        and owner.get("uid") == uid
        for owner in owners
    )


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
    # Per pod uid, the state last acted on (or FINAL), to skip pod events that change nothing.
    observations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Per node name, its allocatable resources: a sandbox larger than every node never queues.
    node_allocatable: dict[str, Manifest] = field(default_factory=dict)
    warm: WarmPath = field(init=False)
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

    async def close(self) -> None:
        await self.warm.close()
        await self.kube.close()

    # --- starting -------------------------------------------------------------------------

    async def start(
        self, execution: Manifest, *, deny_all_present: bool, pools: list[Manifest] | None = None
    ) -> None:
        """on.create / on.resume: make sure an unfinished execution has its pod, once: one
        claimed from a fitting pool of its namespace (`pools`), else one of its own."""
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
        pod_name = child_name(name, uid)
        if status.get("startMode") == "warm":
            return  # the serve daemon runs it, and re-attaches after a restart
        if status.get("podName"):
            # A pod was created before (this process or an earlier one): follow it, never
            # create a second one. If it is gone, the run is lost.
            pod = await self.kube.read_pod(namespace, pod_name, uid=uid)
            if pod is None or not owned_by(pod, uid):
                await self.record_lost(execution)
            else:
                await self.follow(execution, pod)
            return
        claimed = await self.warm.claim(execution, spec, plan, pools or [])
        if claimed is not None:
            await self._record_claim(execution, claimed)
            return
        pod = await self._create_children(execution, spec, plan, deny_all_present)
        if pod is not None:
            await self.follow(execution, pod)

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
        proxy = await self.proxy.resolve()
        if proxy is None:
            raise kopf.TemporaryError("the egress proxy's Service has no address yet", delay=5)
        grant = execution_grant(
            spec.network,
            namespace=namespace,
            uid=uid,
            timeout_seconds=plan.timeout_seconds,
            now=time.time(),
            startup=self.settings.pod_startup_timeout_seconds,
        )
        return proxy, proxy_env(proxy, grant)

    async def _blocked_for(self, execution: Manifest, verdict: Verdict) -> list[BlockedEgress]:
        """When an execution with host entries ends: what the proxy refused for it (best
        effort: a proxy that does not answer never holds up or fails the run)."""
        network = (execution.get("spec") or {}).get("network") or {}
        if self.proxy is None or not is_terminal(verdict.phase):
            return []
        if not any("host" in entry for entry in network.get("allow") or []):
            return []
        try:
            return await self.proxy.blocked(execution["metadata"]["uid"])
        except API_ERRORS as error:
            logger.warning("egress report of %s: %s", execution["metadata"]["name"], error)
            return []

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
        meta = pod.get("metadata") or {}
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
        await self.record(execution, verdict, pod_name=pod_meta["name"])
        if verdict.terminal:
            await self.kube.delete_pod(meta["namespace"], pod_meta["name"], uid=meta["uid"])
        # Later events that show this same state (or the deletion we caused) need no look.
        self.observations[str(pod_meta.get("uid"))] = (
            FINAL if verdict.terminal else pod_state_key(pod)
        )

    async def judge(self, execution: Manifest, pod: Manifest) -> Verdict:
        """The verdict for a pod, reading its log (and events) only when that adds to it."""
        meta = execution["metadata"]
        mode = str((execution.get("spec") or {}).get("mode") or "run")
        log = None
        # The log is read only to verify a summary the runner's exit vouches for: without
        # one it holds nothing that may be believed.
        summary = accepted_summary(pod)
        if summary is not None:
            try:
                log = await self.kube.read_pod_log(
                    meta["namespace"],
                    pod["metadata"]["name"],
                    uid=meta["uid"],
                    summary=summary,
                    tail_bytes=self.settings.status_output_bytes,
                    limit_bytes=self.settings.log_read_limit_bytes,
                )
            except (KubeError, *TRANSIENT_ERRORS) as error:
                # The termination message still has the result; only the output tails are lost.
                logger.warning("no log for pod %s: %s", pod["metadata"]["name"], error)
        verdict = observe_pod(
            pod,
            log=log,
            mode=mode,
            timeout_seconds=timeout_of(execution),
            now=now(),
            settings=self.settings,
            largest_node=NodeRoom.largest(self.node_allocatable.values()),
        )
        if verdict.reason == "StartupTimeout" and not pod_finished(pod):
            warning = await self.kube.latest_warning(
                meta["namespace"], pod["metadata"]["name"], uid=meta["uid"]
            )
            if warning:
                verdict = replace(verdict, message=f"{verdict.message}; {warning}")
        return verdict

    async def watch(self, execution: Manifest, pods: list[Manifest]) -> None:
        """Watchdog tick for an unfinished execution: time-based verdicts and lost pods."""
        status = execution.get("status") or {}
        if is_terminal(status.get("phase")) or not status.get("podName"):
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
        mode = str((execution.get("spec") or {}).get("mode") or "run")
        verdict = observe_pod(
            pod,
            log=None,
            mode=mode,
            timeout_seconds=timeout_of(execution),
            now=now(),
            settings=self.settings,
            largest_node=NodeRoom.largest(self.node_allocatable.values()),
        )
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

    def next_check_in(self, execution: Manifest) -> float:
        """Seconds until the watchdog should look at an unfinished execution: its interval,
        or sooner, just after the program's deadline."""
        interval = self.settings.watchdog_interval_seconds
        started = parse_time((execution.get("status") or {}).get("startedAt"))
        if started is None:
            return interval
        deadline = run_deadline(started, timeout_of(execution), self.settings)
        until = (deadline - now()).total_seconds() + DEADLINE_SLACK_SECONDS
        return until if 0 < until < interval else interval

    # --- warm: a pod claimed from a pool -----------------------------------------------

    async def _record_claim(self, execution: Manifest, pod: Manifest) -> None:
        """The program starts at the claim; the status names the pod before it runs."""
        started = now()
        verdict = Verdict(
            "Running",
            "Started",
            "the program runs in a ready pod from a pool",
            started_at=started,
            start_mode="warm",
            wait_ms=wait_ms(execution, started),
        )
        meta, pod_name = execution["metadata"], pod["metadata"]["name"]
        self.warm.claimed[meta["uid"]] = pod
        if not await self.record(execution, verdict, pod_name=pod_name):
            current = await self.kube.get_execution(meta["namespace"], meta["name"], uid=None)
            if current is None or is_terminal((current.get("status") or {}).get("phase")):
                await self.kube.delete_pod(meta["namespace"], pod_name, uid=meta["uid"])

    async def run_warm(self, execution: Manifest) -> None:
        """The serve daemon: run (or re-attach to) the program in its claimed pod, record the
        runner's verified result (never the kubelet's), then remove the pod."""
        status = execution.get("status") or {}
        meta = execution["metadata"]
        if is_terminal(status.get("phase")) or status.get("startMode") != "warm":
            return
        pod = self.warm.claimed.pop(meta["uid"], None) or await self.kube.read_pod(
            meta["namespace"], status["podName"], uid=meta["uid"]
        )
        if pod is None or not owned_by(pod, meta["uid"]):
            await self.record_lost(execution)
            return
        spec = CodeExecutionSpec.model_validate(execution.get("spec") or {})
        plan = plan_execution(spec, self.catalog, self.settings)
        started = parse_time(status.get("startedAt")) or now()
        deadline = run_deadline(started, plan.timeout_seconds, self.settings)
        try:
            log = await self.warm.run(
                pod,
                run_request(meta["uid"], spec, plan, self.settings),
                seconds_left=(deadline - now()).total_seconds(),
            )
        except TimeoutError:
            verdict = _past_deadline(started, plan.timeout_seconds)
        except RunnerUnavailable:
            verdict = _runner_unavailable(started)
        else:
            verdict = observe_served(
                pod, log, mode=spec.mode, started_at=started, now=now(), settings=self.settings
            )
        await self.record(execution, verdict)
        await self.kube.delete_pod(meta["namespace"], pod["metadata"]["name"], uid=meta["uid"])

    async def _warm_backstop(self, execution: Manifest) -> None:
        """A warm run whose serve daemon did not end it well past its deadline."""
        status, meta = execution.get("status") or {}, execution["metadata"]
        started = parse_time(status.get("startedAt"))
        if started is None:
            return
        timeout = timeout_of(execution)
        if now() < run_deadline(started, timeout, self.settings) + WARM_BACKSTOP:
            return
        if await self.record(execution, _past_deadline(started, timeout)):
            await self.kube.delete_pod(meta["namespace"], status["podName"], uid=meta["uid"])

    # --- ending ---------------------------------------------------------------------------

    async def cancel(self, execution: Manifest) -> None:
        status = execution.get("status") or {}
        if is_terminal(status.get("phase")):
            return
        meta = execution["metadata"]
        finished = now()
        started = parse_time(status.get("startedAt"))
        duration = int((finished - started).total_seconds() * 1000) if started else None
        verdict = Verdict(
            "Cancelled",
            "Cancelled",
            f"cancelled on request ({CANCEL_ANNOTATION})",
            retryable=False,
            finished_at=finished,
            duration_ms=duration,
        )
        await self.record(execution, verdict)
        if status.get("podName"):
            await self.kube.delete_pod(meta["namespace"], status["podName"], uid=meta["uid"])

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
            return
        await self.kube.label_finished(meta["namespace"], meta["name"], uid=meta["uid"])

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
        self, execution: Manifest, verdict: Verdict, *, pod_name: str | None = None
    ) -> bool:
        """Write the verdict into status (compare-and-swap); True if this call moved it."""
        meta = execution["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        current: Manifest | None = execution
        blocked: list[BlockedEgress] | None = None
        for _ in range(MAX_WRITE_ATTEMPTS):
            if current is None or current["metadata"].get("uid") != uid:
                return False
            previous = current.get("status") or {}
            if not supersedes(verdict, previous):
                return False
            if blocked is None:
                blocked = await self._blocked_for(execution, verdict)
            new = next_status(
                previous,
                verdict,
                generation=current["metadata"].get("generation"),
                pod_name=pod_name,
                now=now(),
            )
            if blocked:
                new["egressBlocked"] = [b.model_dump(mode="json") for b in blocked]
            patch = status_patch(previous, new)
            if not patch:
                return False
            try:
                await self.kube.patch_execution_status(
                    namespace,
                    name,
                    uid=uid,
                    resource_version=current["metadata"]["resourceVersion"],
                    status=patch,
                )
            except KubeError as error:
                if error.status == 404:
                    return False
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
            return True
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


def _past_deadline(started: datetime, timeout_seconds: int) -> Verdict:
    finished = now()
    duration = int((finished - started).total_seconds() * 1000)
    base = {"started_at": started, "finished_at": finished, "duration_ms": duration}
    return timed_out_by_platform(timeout_seconds, base)


def _runner_unavailable(started: datetime) -> Verdict:
    """The runner gave no whole answer: the run is over, without a result (never re-run)."""
    return Verdict(
        "Error",
        "RunnerUnavailable",
        "the sandbox's runner could not be reached or stopped answering before it reported "
        "a result; the program was not run again",
        retryable=True,
        started_at=started,
        finished_at=now(),
    )


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

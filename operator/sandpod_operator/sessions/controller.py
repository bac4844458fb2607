"""CodeSessions (docs: the session design): one serving sandbox kept for one user, and the
executions that name the session, run there one at a time in creation order.

Pure parts first (the session's sandbox, its deadlines, whether an execution may run in it,
the queue's order, the session's status), then `SessionController`: it starts a session's pod
(claimed from a pool of session pods with the warm path's exactly-once claim, else its own),
and one daemon per live session runs its queue. Each run is the warm path's: the execution's
status names the pod first (Running), then POST /v1/run with the execution's uid, so after an
operator restart the head of the queue is re-attached, never run twice; the result comes
from the runner's verified summary. The pod stays after a run; it goes with the session.

A session whose allowlist names hosts gets its own pod (pool pods carry no proxy
credentials), with the egress proxy's variables for a grant of its own (egress/proxy.py), and
each of its runs reports what the proxy refused the session while it ran.
"""

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Protocol

import kopf
from pydantic import ValidationError
from sandpod_contract.catalog import Catalog
from sandpod_contract.models import (
    BlockedEgress,
    CodeExecutionSpec,
    CodeSessionSpec,
    CodeSessionStatus,
    Condition,
    Network,
    Resources,
    format_time,
    is_terminal,
    parse_time,
)
from sandpod_contract.names import (
    SESSION_END_ANNOTATION,
    SESSION_KIND,
    SESSION_LABEL,
    SESSION_PLURAL,
)
from sandpod_contract.runner import LogSummary

from sandpod_operator.egress.proxy import (
    EgressProxy,
    ProxyClient,
    Refusals,
    blocked_between,
    session_grant,
)
from sandpod_operator.executions.builders import (
    InvalidSpecError,
    Sandbox,
    build_egress_policy,
    build_network_policy,
    catalog_language,
    check_egress,
    limits_within,
    plan_execution,
)
from sandpod_operator.kube import API_ERRORS, Key, KubeApi, KubeError, Manifest
from sandpod_operator.owners import as_body, owned_by
from sandpod_operator.pools.builders import (
    SESSION_RUNNER_INGRESS_POLICY_NAME,
    build_runner_ingress_policy,
    build_session_configmap,
    build_session_pod,
)
from sandpod_operator.pools.warm import Wanted, WarmPath, pod_ready, wait_ms
from sandpod_operator.serving.core import InvalidRun, NotServing, serve_once
from sandpod_operator.settings import OperatorSettings
from sandpod_operator.status import (
    WAITING_FOR_SESSION,
    Verdict,
    cancelled_on_request,
    clip_message,
    pod_finished,
    set_condition,
    startup_step_at,
    status_patch,
)
from sandpod_operator.wakeups import Wakeups

logger = logging.getLogger(__name__)

SESSION_ENDED = "SessionEnded"
SESSION_NOT_FOUND = "SessionNotFound"
SESSION_ENDED_MESSAGE = "the session this execution names has ended; nothing was run"
SESSION_NOT_FOUND_MESSAGE = "no CodeSession of that name exists in this namespace; nothing was run"
STATE_LOST_MESSAGE = (
    "; the session's interpreter was restarted (by this execution or one before it): "
    "variables and imports from earlier executions are gone, files remain"
)
SANDBOX_LOST_MESSAGE = "the session's sandbox pod stopped or disappeared; its state is gone"
MAX_WRITE_ATTEMPTS = 5
# How often a live session is looked at without events (pod, executions) waking it.
RESYNC_SECONDS = 30.0
STARTING_POLL_SECONDS = 1.0
DEADLINE_SLACK_SECONDS = 0.05
# Direct runs that end within this of each other are counted in one session status write.
ACTIVITY_WRITE_SECONDS = 1.0
# Cancels of runs that were not on a runner yet, kept until their turn (or forgotten).
CANCELS_REMEMBERED = 1024


def now() -> datetime:
    return datetime.now(UTC)


# --- pure ---------------------------------------------------------------------------------


def plan_session(spec: CodeSessionSpec, catalog: Catalog, settings: OperatorSettings) -> Sandbox:
    """The session's sandbox, or InvalidSpecError naming the field."""
    return Sandbox(
        language=catalog_language(spec.language, catalog),
        runtime_class_name=settings.runtime_class_name,
        **limits_within(spec.resources, settings),
    )


def session_wants(spec: CodeSessionSpec, sandbox: Sandbox) -> Wanted:
    return Wanted(spec.language, spec.network.egress, sandbox, sessions=True)


def pools_for(spec: CodeSessionSpec, pools: Iterable[Manifest]) -> list[Manifest]:
    """The pools a session may start from: the one it names, else every one."""
    return [
        pool
        for pool in pools
        if spec.pool is None or (pool.get("metadata") or {}).get("name") == spec.pool
    ]


def created_at(manifest: Manifest) -> datetime:
    return parse_time((manifest.get("metadata") or {}).get("creationTimestamp")) or now()


def end_requested(session: Manifest) -> datetime | None:
    """The end the session's SESSION_END_ANNOTATION sets, if any."""
    annotations = (session.get("metadata") or {}).get("annotations") or {}
    return parse_time(annotations.get(SESSION_END_ANNOTATION))


def deadlines(
    spec: CodeSessionSpec, status: Manifest, created: datetime, end: datetime | None = None
) -> dict[str, datetime]:
    """When the session ends unless something happens: idle counts from its last execution's
    end (or from when it was ready), the lifetime from its creation, cut short by `end`."""
    idle_since = (
        parse_time(status.get("lastActivityAt")) or parse_time(status.get("startedAt")) or created
    )
    lifetime = created + timedelta(seconds=spec.max_lifetime_seconds)
    return {
        "IdleTimeout": idle_since + timedelta(seconds=spec.idle_timeout_seconds),
        "LifetimeExceeded": lifetime if end is None else min(lifetime, end),
    }


def expiry_reason(
    spec: CodeSessionSpec,
    status: Manifest,
    created: datetime,
    at: datetime,
    end: datetime | None = None,
) -> str:
    """IdleTimeout or LifetimeExceeded once due, else ''."""
    due = [reason for reason, when in deadlines(spec, status, created, end).items() if at >= when]
    return "LifetimeExceeded" if "LifetimeExceeded" in due else (due[0] if due else "")


def expiry_message(
    reason: str, spec: CodeSessionSpec, created: datetime, end: datetime | None = None
) -> str:
    if reason == "IdleTimeout":
        return f"no execution for {spec.idle_timeout_seconds}s (idle timeout)"
    if end is not None and end < created + timedelta(seconds=spec.max_lifetime_seconds):
        return f"the session reached the end set for it, {format_time(end)}"
    return f"the session reached its maximum lifetime of {spec.max_lifetime_seconds}s"


def execution_problem(spec: CodeExecutionSpec, session: str, session_spec: CodeSessionSpec) -> str:
    """Why an execution cannot run in its session (the field named), or ''."""
    if spec.language != session_spec.language:
        return (
            f"spec.language: {spec.language!r} differs from session {session!r}'s language "
            f"{session_spec.language!r}"
        )
    if spec.mode != "run":
        return "spec.mode: only mode run is possible in a session"
    for field_name, value, default in (
        ("resources", spec.resources, Resources()),
        ("network", spec.network, Network()),
        ("runtimeClassName", spec.runtime_class_name, None),
    ):
        if value != default:
            return f"spec.{field_name}: comes from the session {session!r}; leave it out"
    return ""


def queue_order(executions: Iterable[Manifest]) -> list[Manifest]:
    """A session's unfinished executions in the order they run: creation, then name."""
    waiting = [e for e in executions if not is_terminal((e.get("status") or {}).get("phase"))]
    return sorted(
        waiting,
        key=lambda e: (str(e["metadata"].get("creationTimestamp") or ""), e["metadata"]["name"]),
    )


def session_status(
    session: Manifest, phase: str, reason: str, message: str, at: datetime, **fields: Any
) -> Manifest:
    """The session's whole status after a change (fields: the model's, by name), built
    through its model, with the Ready condition and expiresAt kept in step."""
    previous = session.get("status") or {}
    generation = session["metadata"].get("generation")
    values = CodeSessionStatus.model_validate({"phase": phase, **previous}).model_dump()
    values.update(fields, phase=phase, reason=reason, message=message or None)
    spec = CodeSessionSpec.model_validate(session.get("spec") or {})
    if phase == "Ended":
        values["expires_at"] = None
    elif phase != "Starting":
        values["expires_at"] = min(
            deadlines(spec, _camel(values), created_at(session), end_requested(session)).values()
        )
    conditions = {c["type"]: c for c in previous.get("conditions") or [] if "type" in c}
    live = "True" if phase in ("Ready", "Busy") else "False"
    set_condition(conditions, "Ready", live, reason, message, format_time(at), generation)
    values["conditions"] = [Condition.model_validate(conditions[k]) for k in sorted(conditions)]
    values["observed_generation"] = generation
    status = CodeSessionStatus.model_validate(values)
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _camel(values: Manifest) -> Manifest:
    """The few status fields `deadlines` reads, as the API has them."""
    return {
        "lastActivityAt": _text(values.get("last_activity_at")),
        "startedAt": _text(values.get("started_at")),
    }


def _text(value: Any) -> str | None:
    return format_time(value) if isinstance(value, datetime) else value


def served_verdict(verdict: Verdict, log: LogSummary, session: str, tail_chars: int) -> Verdict:
    """A run's verdict with what the session's runner adds: the trailing value (bounded like
    the output tails) and whether the interpreter's state was lost."""
    result = log.result
    if result is None:
        return replace(verdict, session=session)
    value = result.value[-tail_chars:] if result.value is not None and tail_chars else None
    lost = result.state_lost or None
    message = verdict.message + (STATE_LOST_MESSAGE if lost else "")
    return replace(verdict, session=session, result=value, state_lost=lost, message=message)


def sandbox_lost(pod: Manifest | None, session_uid: str) -> bool:
    if pod is None or not owned_by(pod, session_uid, SESSION_KIND):
        return True
    return bool(pod["metadata"].get("deletionTimestamp")) or pod_finished(pod)


def newer(first: Manifest, second: Manifest | None) -> Manifest:
    """The later of two copies of one object (by resourceVersion, etcd's counter)."""
    if second is None:
        return first
    try:
        ahead = int(second["metadata"]["resourceVersion"]) > int(
            first["metadata"]["resourceVersion"]
        )
    except (KeyError, TypeError, ValueError):
        return first
    return second if ahead else first


# --- the controller -----------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """One run's answer from the session's runner: its verdict, what the egress proxy
    refused it (None: unknown or no host entries), whether the sandbox was lost."""

    verdict: Verdict
    blocked: list[BlockedEgress] | None
    lost: bool


class SessionBusy(Exception):
    """As many runs as the session may queue are running or waiting."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} runs are already running or waiting in this session")
        self.limit = limit


class Recording(Protocol):
    """The Reconciler's status write of an execution (compare-and-swap)."""

    async def __call__(
        self,
        execution: Manifest,
        verdict: Verdict,
        *,
        pod_name: str | None = None,
        egress_blocked: list[BlockedEgress] | None = None,
    ) -> Manifest | None: ...


# The Reconciler's storing of a final verdict's output files (ConfigMap, listed in the verdict).
StoringOutputs = Callable[[Manifest, Verdict], Awaitable[Verdict]]


@dataclass
class SessionController:
    kube: KubeApi
    settings: OperatorSettings
    catalog: Catalog
    warm: WarmPath
    record: Recording
    store_outputs: StoringOutputs
    wakeups: Wakeups = field(default_factory=Wakeups)
    # Per session uid: its status as this process last wrote it (watch events lag behind).
    written: dict[str, Manifest] = field(default_factory=dict)
    # Executions this process ended (the index may still show them unfinished for a moment).
    finished: set[str] = field(default_factory=set)
    # Namespaces whose session runner-ingress policy this process has ensured.
    protected: set[str] = field(default_factory=set)
    # The egress proxy, when the operator has one (sessions with host entries use it).
    proxy: ProxyClient | None = None
    # Per session uid (with host entries): what the proxy had refused it when its last run
    # ended, so that each run's report is the growth since (runs are one at a time).
    refused: dict[str, Refusals] = field(default_factory=dict)
    # Per session uid: its runner's turns (one run at a time), how many hold or wait for one,
    # and its pod as the daemon last read it (the direct path reads no pod).
    turns: dict[str, asyncio.Lock] = field(default_factory=dict)
    in_turn: Counter[str] = field(default_factory=Counter)
    pods: dict[str, Manifest] = field(default_factory=dict)
    # Per session uid: direct runs not yet counted in its status, the last one's end, and the
    # task writing them.
    unwritten_runs: Counter[str] = field(default_factory=Counter)
    last_run_end: dict[str, datetime] = field(default_factory=dict)
    activity_writers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # Per run id: the pod of a run on its runner now; runs asked to stop before their turn.
    serving: dict[str, Manifest] = field(default_factory=dict)
    cancel_requested: OrderedDict[str, None] = field(default_factory=OrderedDict)

    # --- waking -------------------------------------------------------------------------

    def forget(self, key: Key, uid: str) -> None:
        self.wakeups.forget(key)
        self.written.pop(uid, None)
        self.refused.pop(uid, None)
        self.turns.pop(uid, None)
        self.pods.pop(uid, None)

    def freshest(self, session: Manifest) -> Manifest:
        return newer(session, self.written.get(session["metadata"]["uid"]))

    # --- starting -----------------------------------------------------------------------

    async def start(self, session: Manifest, *, pools: list[Manifest], deny_all: bool) -> None:
        """on.create / on.resume: give the session its pod, once (claimed, else its own)."""
        session = self.freshest(session)
        status, meta = session.get("status") or {}, session["metadata"]
        if status.get("phase") == "Ended" or status.get("podName"):
            return
        try:
            spec = CodeSessionSpec.model_validate(session.get("spec") or {})
            sandbox = plan_session(spec, self.catalog, self.settings)
            check_egress(
                spec.network,
                self.settings.egress_bounds,
                meta["namespace"],
                proxy_configured=self.proxy is not None,
            )
        except (ValidationError, InvalidSpecError) as error:
            message = clip_message(str(error))
            await self._end(session, "InvalidSpec", message, [])
            raise kopf.PermanentError(message) from error
        pod = await self.warm.claim(
            session, SESSION_LABEL, session_wants(spec, sandbox), pools_for(spec, pools)
        )
        mode = "warm" if pod is not None else "cold"
        if pod is None:
            pod = await self._create_own_pod(session, spec, sandbox, deny_all)
        message = "its sandbox is starting" if mode == "cold" else "it claimed a ready sandbox"
        await self._write(
            session,
            lambda current: session_status(
                current,
                "Starting",
                "Starting",
                message,
                now(),
                pod_name=pod["metadata"]["name"],
                start_mode=mode,
            ),
        )
        self.wakeups.poke((meta["namespace"], meta["name"]))

    async def _create_own_pod(
        self, session: Manifest, spec: CodeSessionSpec, sandbox: Sandbox, deny_all: bool
    ) -> Manifest:
        meta = session["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if not deny_all:
            await self.kube.create_network_policy(build_network_policy(namespace), uid=None)
        if namespace not in self.protected:
            ingress = build_runner_ingress_policy(
                namespace,
                self.settings.runner_ingress_from,
                name=SESSION_RUNNER_INGRESS_POLICY_NAME,
                selector_label=SESSION_LABEL,
            )
            if ingress is not None:
                await self.kube.create_network_policy(ingress, uid=None)
            self.protected.add(namespace)
        proxy, proxy_variables = await self._proxy_for(session, spec)
        egress = build_egress_policy(
            owner_label=SESSION_LABEL,
            execution_name=name,
            namespace=namespace,
            uid=uid,
            bounds=self.settings.egress_bounds,
            network=spec.network,
            proxy=proxy,
        )
        configmap = build_session_configmap(
            namespace=namespace,
            session_name=name,
            uid=uid,
            sandbox=sandbox,
            settings=self.settings,
            extra_env=proxy_variables,
        )
        pod = build_session_pod(configmap, sandbox, self.settings)
        children: list[tuple[Manifest, Any]] = [
            (configmap, self.kube.create_configmap),
            (pod, self.kube.create_pod),
        ]
        if egress is not None:
            children.insert(0, (egress, self.kube.create_network_policy))
        for child, create in children:  # each the session's, so removed with it
            kopf.adopt(child, owner=as_body(session))
            found = await self._own(session, child, await create(child, uid=uid))
        if proxy is not None:
            self.refused[uid] = Counter()  # a new grant: nothing refused yet
        return found

    async def _proxy_for(
        self, session: Manifest, spec: CodeSessionSpec
    ) -> tuple[EgressProxy | None, dict[str, str]]:
        """The egress proxy and the sandbox's variables for it, when the allowlist names
        hosts: the same at the pod's start and at each run (the runner checks)."""
        if self.proxy is None or not spec.network.host_rules:
            return None, {}
        meta = session["metadata"]
        grant = session_grant(
            spec.network,
            namespace=meta["namespace"],
            uid=meta["uid"],
            created=created_at(session).timestamp(),
            lifetime_seconds=spec.max_lifetime_seconds,
        )
        return await self.proxy.access(grant)

    async def _own(self, session: Manifest, wanted: Manifest, found: Manifest | None) -> Manifest:
        """The child as the cluster has it, if it is this session's; a namesake that is not
        ends the session and is left alone."""
        kind, name = wanted["kind"], wanted["metadata"]["name"]
        if found is None:
            raise kopf.TemporaryError(f"{kind} {name} vanished while being created", delay=1)
        if owned_by(found, session["metadata"]["uid"], SESSION_KIND):
            return found
        message = f"a {kind} named {name} already exists and does not belong to this session"
        await self._end(session, "ChildConflict", message, [])
        raise kopf.PermanentError(message)

    # --- the daemon: one pass -----------------------------------------------------------

    async def tick(self, session: Manifest, executions: list[Manifest]) -> float:
        """Bring a live session forward by one step (its pod ready, its next execution run,
        its end when due); seconds until the next step is due without events."""
        session = self.freshest(session)
        status, meta = session.get("status") or {}, session["metadata"]
        if status.get("phase") == "Ended" or not status.get("podName"):
            return RESYNC_SECONDS
        pod = await self.kube.read_pod(meta["namespace"], status["podName"], uid=None)
        if pod is None or sandbox_lost(pod, meta["uid"]):
            self.pods.pop(meta["uid"], None)
            await self._end(session, "SandboxLost", SANDBOX_LOST_MESSAGE, executions)
            return RESYNC_SECONDS
        self.pods[meta["uid"]] = pod
        spec = CodeSessionSpec.model_validate(session["spec"])
        if status.get("phase") == "Starting":
            return await self._starting(session, spec, pod, executions)
        queue = [e for e in queue_order(executions) if e["metadata"]["uid"] not in self.finished]
        created, end = created_at(session), end_requested(session)
        reason = expiry_reason(spec, status, created, now(), end)
        if queue and reason != "LifetimeExceeded":
            await self._run(session, spec, pod, queue[0])
            return 0.0
        if reason == "IdleTimeout" and self.in_turn.get(meta["uid"]):
            return STARTING_POLL_SECONDS  # not idle: a direct run runs or waits its turn
        if reason:
            message = expiry_message(reason, spec, created, end)
            await self._end(session, reason, message, executions)
            return RESYNC_SECONDS
        until = min(deadlines(spec, status, created, end).values()) - now()
        return min(RESYNC_SECONDS, until.total_seconds() + DEADLINE_SLACK_SECONDS)

    async def _starting(
        self, session: Manifest, spec: CodeSessionSpec, pod: Manifest, executions: list[Manifest]
    ) -> float:
        """Ready once its runner is (and its credential read); ended if that takes too long."""
        if pod_ready(pod) and await self.warm.credential(pod) is not None:
            started = now()
            await self._write(
                session,
                lambda current: session_status(
                    current, "Ready", "Started", "ready for executions", started, started_at=started
                ),
            )
            return 0.0
        at = now()
        waited = (at - startup_step_at(pod, at)).total_seconds()
        if waited >= self.settings.pod_startup_timeout_seconds:
            message = (
                f"the session's sandbox did not start within "
                f"{self.settings.pod_startup_timeout_seconds}s of its last step"
            )
            await self._end(session, "StartupTimeout", message, executions)
            return RESYNC_SECONDS
        return STARTING_POLL_SECONDS

    # --- running one execution ----------------------------------------------------------

    async def _run(
        self, session: Manifest, session_spec: CodeSessionSpec, pod: Manifest, execution: Manifest
    ) -> None:
        """Run the head of the queue (or re-attach to it) and record both statuses."""
        name, uid = session["metadata"]["name"], execution["metadata"]["uid"]
        spec, plan, problem = self._execution_plan(execution, session)
        if problem or spec is None or plan is None:
            await self._refuse(execution, "InvalidSpec", problem, name)
            return
        status = execution.get("status") or {}
        started = parse_time(status.get("startedAt")) if status.get("phase") == "Running" else None
        if started is None:
            started = now()
            running = Verdict(
                "Running",
                "Started",
                "the program runs in its session's sandbox",
                started_at=started,
                session=name,
                wait_ms=wait_ms(execution, started),
            )
            moved, _ = await asyncio.gather(
                self.record(execution, running, pod_name=pod["metadata"]["name"]),
                self._write(session, lambda current: self._phase(current, "Busy")),
            )
            if not moved and not await self._still_ours(execution):
                self.finished.add(uid)
                return
        async with self.turn(session["metadata"]["uid"]):
            served = await self.serve(session, session_spec, pod, uid, spec, plan, started)
        if served.lost:
            await self.record(execution, served.verdict, egress_blocked=served.blocked)
            self.finished.add(uid)
            await self._end(session, "SandboxLost", SANDBOX_LOST_MESSAGE, [])
            return
        verdict = await self.store_outputs(execution, served.verdict)
        ended = now()
        await asyncio.gather(
            self.record(execution, verdict, egress_blocked=served.blocked),
            self._write(session, lambda current: self._after_runs(current, ended, 1)),
        )
        self.finished.add(uid)

    # --- the serving core: one run on the session's runner -------------------------------

    @asynccontextmanager
    async def turn(self, session_uid: str, *, limit: int | None = None) -> AsyncIterator[None]:
        """The session's runner serves one run at a time: runs take turns in arrival order
        (the daemon's queue and the direct path alike); with `limit`, SessionBusy when that
        many are already running or waiting."""
        if limit is not None and self.in_turn[session_uid] >= limit:
            raise SessionBusy(limit)
        self.in_turn[session_uid] += 1
        try:
            async with self.turns.setdefault(session_uid, asyncio.Lock()):
                yield
        finally:
            self.in_turn[session_uid] -= 1
            if not self.in_turn[session_uid]:
                del self.in_turn[session_uid]

    async def serve(
        self,
        session: Manifest,
        session_spec: CodeSessionSpec,
        pod: Manifest,
        run_id: str,
        spec: CodeExecutionSpec,
        plan: Any,
        started: datetime,
    ) -> Served:
        """Run (or re-attach to: same `run_id`) one execution on the session's runner, in
        the caller's turn: the runner's verified verdict, or the platform's when it did not
        answer (then the sandbox is lost)."""
        name = session["metadata"]["name"]
        if run_id in self.cancel_requested:
            del self.cancel_requested[run_id]
            cancelled = cancelled_on_request(session=name, started_at=started, finished_at=now())
            return Served(cancelled, None, lost=False)
        _, proxy_variables = await self._proxy_for(session, session_spec)
        before = await self._refused_before(session, session_spec)
        self.serving[run_id] = pod
        try:
            answer = await serve_once(
                self.warm, pod, run_id, spec, plan, started, self.settings, proxy_variables
            )
        finally:
            self.serving.pop(run_id, None)
        blocked = await self._blocked_since(session, before)
        if answer.log is None:
            return Served(replace(answer.verdict, session=name), blocked, lost=True)
        tail_chars = self.settings.status_output_bytes
        verdict = served_verdict(answer.verdict, answer.log, name, tail_chars)
        return Served(verdict, blocked, lost=False)

    async def cancel(self, run_id: str) -> bool:
        """Stop a run: on its session's runner if it runs now (Python: interrupted, its
        state kept unless it does not stop; other languages: killed), then True; one still
        waiting for its turn ends Cancelled when the turn comes, without running."""
        pod = self.serving.get(run_id)
        if pod is not None and await self.warm.cancel(pod, run_id):
            return True
        self.cancel_requested[run_id] = None
        while len(self.cancel_requested) > CANCELS_REMEMBERED:
            self.cancel_requested.popitem(last=False)
        return False

    async def run_direct(
        self, session: Manifest, execution: Manifest, on_start: Callable[[], None]
    ) -> Served:
        """The direct path: run `execution` (not a CodeExecution yet: its record is written
        behind) in the live session, in turn; `on_start` once its turn has come. Refuses with
        NotServing (not ready, ended, sandbox gone), InvalidRun or SessionBusy."""
        session = self.freshest(session)
        status, meta = session.get("status") or {}, session["metadata"]
        if status.get("phase") not in ("Ready", "Busy") or not status.get("podName"):
            raise NotServing(f"the session is {str(status.get('phase') or 'Starting').lower()}")
        spec, plan, problem = self._execution_plan(execution, session)
        if problem or spec is None or plan is None:
            raise InvalidRun(problem)
        pod = self.pods.get(meta["uid"]) or await self.kube.read_pod(
            meta["namespace"], status["podName"], uid=None
        )
        if pod is None or sandbox_lost(pod, meta["uid"]):
            raise NotServing("the session's sandbox is gone")
        session_spec = CodeSessionSpec.model_validate(session["spec"])
        run_id = f"{meta['namespace']}/{execution['metadata']['name']}"
        async with self.turn(meta["uid"], limit=self.settings.session_queue_limit):
            on_start()
            served = await self.serve(session, session_spec, pod, run_id, spec, plan, now())
        if served.lost:
            await self._end(session, "SandboxLost", SANDBOX_LOST_MESSAGE, [])
        else:
            self._note_run(session, now())
        return served

    def _note_run(self, session: Manifest, ended: datetime) -> None:
        """Count a direct run into the session's status (lastActivityAt, executionCount):
        written behind, runs that end close together in one write."""
        uid = session["metadata"]["uid"]
        self.unwritten_runs[uid] += 1
        self.last_run_end[uid] = ended
        if uid not in self.activity_writers:
            task = asyncio.create_task(self._write_activity(session))
            self.activity_writers[uid] = task

    async def _write_activity(self, session: Manifest) -> None:
        uid = session["metadata"]["uid"]
        try:
            while self.unwritten_runs[uid]:
                runs, ended = self.unwritten_runs[uid], self.last_run_end[uid]
                change = partial(self._after_runs, ended=ended, runs=runs)
                await self._write(session, change)
                self.unwritten_runs[uid] -= runs
                await asyncio.sleep(ACTIVITY_WRITE_SECONDS)
        except (*API_ERRORS, kopf.TemporaryError) as error:
            logger.warning("the session's activity was not written: %s", error)
        finally:
            self.activity_writers.pop(uid, None)
            self.unwritten_runs.pop(uid, None)

    # --- what the egress proxy refused a run --------------------------------------------

    async def _refused_before(self, session: Manifest, spec: CodeSessionSpec) -> Refusals | None:
        """What the proxy had refused the session before this run (kept from its last run's
        end; asked once after a restart); None without host entries (nothing asked) or when
        unknown."""
        uid = session["metadata"]["uid"]
        if self.proxy is None or not spec.network.host_rules:
            return None
        if uid not in self.refused:
            counts = await self.proxy.refusals(uid)
            if counts is None:
                return None
            self.refused[uid] = counts
        return self.refused[uid]

    async def _blocked_since(
        self, session: Manifest, before: Refusals | None
    ) -> list[BlockedEgress] | None:
        """What the proxy refused the session since `before`: this run's report (None when
        unknown; a proxy that does not answer never fails the run)."""
        uid = session["metadata"]["uid"]
        if self.proxy is None or before is None:
            return None
        after = await self.proxy.refusals(uid)
        if after is None:
            self.refused.pop(uid, None)  # unknown now: asked again before the next run
            return None
        self.refused[uid] = after
        return blocked_between(before, after)

    def _execution_plan(self, execution: Manifest, session: Manifest) -> tuple[Any, Any, str]:
        try:
            spec = CodeExecutionSpec.model_validate(execution.get("spec") or {})
            session_spec = CodeSessionSpec.model_validate(session["spec"])
            plan = plan_execution(spec, self.catalog, self.settings)
            # A run in a session is bounded by the session's sandbox, not by defaults.
            limits = limits_within(session_spec.resources, self.settings)
            plan = replace(
                plan,
                cpu=limits["cpu"],
                memory=limits["memory"],
                ephemeral_storage=limits["ephemeral_storage"],
            )
        except (ValidationError, InvalidSpecError) as error:
            return None, None, clip_message(str(error))
        return spec, plan, execution_problem(spec, session["metadata"]["name"], session_spec)

    async def _still_ours(self, execution: Manifest) -> bool:
        """Whether an execution whose Running write did not land is still to be run."""
        meta = execution["metadata"]
        current = await self.kube.get_execution(meta["namespace"], meta["name"], uid=meta["uid"])
        if current is None or current["metadata"].get("uid") != meta["uid"]:
            return False
        return (current.get("status") or {}).get("phase") == "Running"

    def _phase(self, session: Manifest, phase: str) -> Manifest:
        status = session.get("status") or {}
        return session_status(session, phase, str(status.get("reason") or "Started"), "", now())

    def _after_runs(self, session: Manifest, ended: datetime, runs: int) -> Manifest:
        count = int((session.get("status") or {}).get("executionCount") or 0) + runs
        return session_status(
            session,
            "Ready",
            "Started",
            "ready for executions",
            ended,
            last_activity_at=ended,
            execution_count=count,
        )

    # --- ending -------------------------------------------------------------------------

    async def end(
        self, session: Manifest, reason: str, message: str, executions: list[Manifest]
    ) -> None:
        """Deletion (or any end decided outside the daemon)."""
        await self._end(self.freshest(session), reason, message, executions)

    async def _end(
        self, session: Manifest, reason: str, message: str, executions: list[Manifest]
    ) -> None:
        """Ended for good: the status first, then the pod, then every execution still
        waiting for it (Error/SessionEnded)."""
        meta = session["metadata"]
        await self._write(
            session, lambda current: session_status(current, "Ended", reason, message, now())
        )
        pod_name = (self.freshest(session).get("status") or {}).get("podName")
        if pod_name:
            await self.kube.delete_pod(meta["namespace"], pod_name, uid=None)
        for execution in queue_order(executions):
            await self._refuse(execution, SESSION_ENDED, SESSION_ENDED_MESSAGE, meta["name"])
        # The gateway counts a tenant's live sessions by this label, from metadata alone.
        await self.kube.label_finished(
            meta["namespace"], meta["name"], uid=meta["uid"], plural=SESSION_PLURAL
        )

    async def _refuse(self, execution: Manifest, reason: str, message: str, session: str) -> None:
        verdict = Verdict(
            "Error",
            reason,
            message,
            retryable=reason != "InvalidSpec",
            finished_at=now(),
            session=session,
        )
        await self.record(execution, verdict)
        self.finished.add(execution["metadata"]["uid"])

    # --- the execution's side -----------------------------------------------------------

    async def accept(
        self, execution: Manifest, spec: CodeExecutionSpec, known: Manifest | None
    ) -> None:
        """An execution naming a session was created (or the operator resumed): refuse it
        (no such session, ended, does not fit) or let it wait its turn."""
        meta, name = execution["metadata"], str(spec.session)
        session = known or await self.kube.get_session(meta["namespace"], name)
        if session is None:
            await self._refuse(execution, SESSION_NOT_FOUND, SESSION_NOT_FOUND_MESSAGE, name)
            return
        session = self.freshest(session)
        if session["metadata"].get("deletionTimestamp") or _ended(session):
            await self._refuse(execution, SESSION_ENDED, SESSION_ENDED_MESSAGE, name)
            return
        _, _, problem = self._execution_plan(execution, session)
        if problem:
            await self._refuse(execution, "InvalidSpec", problem, name)
            return
        if not (execution.get("status") or {}).get("phase"):
            waiting = Verdict(
                "Pending",
                WAITING_FOR_SESSION,
                f"waiting for session {name!r} (executions before it run first)",
                session=name,
            )
            await self.record(execution, waiting)
        self.wakeups.poke((meta["namespace"], name))

    async def check(self, execution: Manifest, known: Manifest | None) -> None:
        """Watchdog tick of an unfinished execution in a session: its session gone or ended
        while it waited (the daemon that would have ended it is gone too)."""
        status, meta = execution.get("status") or {}, execution["metadata"]
        name = str((execution.get("spec") or {}).get("session"))
        if status.get("phase") != "Pending":
            return
        session = known or await self.kube.get_session(meta["namespace"], name)
        if session is None or _ended(self.freshest(session)):
            await self._refuse(execution, SESSION_ENDED, SESSION_ENDED_MESSAGE, name)

    # --- writing the session's status ---------------------------------------------------

    async def _write(
        self, session: Manifest, change: Callable[[Manifest], Manifest]
    ) -> Manifest | None:
        """Compare-and-swap the session's status to `change(session)`; never past Ended."""
        meta = session["metadata"]
        current: Manifest | None = self.freshest(session)
        for _ in range(MAX_WRITE_ATTEMPTS):
            if current is None or _ended(current):
                return None
            patch = status_patch(current.get("status") or {}, change(current))
            if not patch:
                return current
            try:
                written = await self.kube.patch_session_status(
                    meta["namespace"],
                    meta["name"],
                    resource_version=current["metadata"]["resourceVersion"],
                    status=patch,
                )
            except KubeError as error:
                if error.status == 404:
                    return None
                if error.status != 409:
                    raise
                current = await self.kube.get_session(meta["namespace"], meta["name"])
                continue
            self.written[meta["uid"]] = written
            return written
        raise kopf.TemporaryError(f"status of session {meta['name']} kept changing", delay=1)


def _ended(session: Manifest) -> bool:
    return (session.get("status") or {}).get("phase") == "Ended"

"""kopf handlers and indexes of CodeExecutions (thin): fetch, hand to the Reconciler,
translate errors for kopf. Registered by importing this module (sandpod_operator.handlers does)."""

import copy
from collections.abc import Mapping
from typing import Any, cast

import kopf
from sandpod_contract.models import is_terminal
from sandpod_contract.names import (
    CANCEL_ANNOTATION,
    EXECUTION_LABEL,
    FINISHED_LABEL,
    GROUP,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLURAL,
    QUEUED_LABEL,
    RECORD_LABEL,
    ROLE_LABEL,
    SANDBOX_ROLE,
    TENANT_LABEL,
    VERSION,
)

from sandpod_operator.admission.handlers import over_stored_bytes
from sandpod_operator.executions.builders import DENY_ALL_POLICY_NAME
from sandpod_operator.executions.queue import Tenant, Waiting, queue_limit
from sandpod_operator.executions.reconciler import Reconciler, is_transient
from sandpod_operator.executions.stalls import StallDetector
from sandpod_operator.kube import API_ERRORS
from sandpod_operator.status import Verdict

EXECUTIONS = (GROUP, VERSION, PLURAL)
PODS = ("v1", "pods")
NODES = ("v1", "nodes")
NETWORK_POLICIES = ("networking.k8s.io", "v1", "networkpolicies")
SANDBOX_POD_LABELS = {ROLE_LABEL: SANDBOX_ROLE, MANAGED_BY_LABEL: MANAGED_BY}
# The filter of every handler of CodeExecutions: records (of direct runs) are not reconciled,
# nor executions waiting in their tenant's queue (executions/queue.py) until it lets them go.
RECONCILED = {RECORD_LABEL: kopf.ABSENT, QUEUED_LABEL: kopf.ABSENT}
# Transient API errors while starting an execution are retried this often (2 s apart),
# then the execution ends with Error/OperatorError instead of staying Pending.
START_RETRIES = 30
TRANSIENT_DELAY_SECONDS = 2


def plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A detached plain-dict copy of a kopf body (reconciler code works on plain dicts)."""
    return copy.deepcopy(dict(body))


def reconciler_of(memo: kopf.Memo) -> Reconciler:
    return cast(Reconciler, memo.reconciler)


def stalls_of(memo: kopf.Memo) -> StallDetector:
    return cast(StallDetector, memo.stalls)


def index_of(handler_kwargs: Mapping[str, Any], name: str) -> kopf.Index[Any, Any]:
    """kopf hands every index to every handler as a keyword argument named after it."""
    return cast(kopf.Index[Any, Any], handler_kwargs[name])


def session_of(handler_kwargs: Mapping[str, Any], execution: dict[str, Any]) -> Any:
    """The session an execution names, as last seen (None: none named, or not seen)."""
    name = (execution.get("spec") or {}).get("session")
    if not name:
        return None
    key = (execution["metadata"]["namespace"], name)
    found: Any = index_of(handler_kwargs, "code_sessions").get(key, [])
    return plain(next(iter(found))) if found else None


def unfinished(status: kopf.Status, **_: Any) -> bool:
    return not is_terminal(status.get("phase"))


def finished(status: kopf.Status, **_: Any) -> bool:
    return is_terminal(status.get("phase"))


def running_warm(status: kopf.Status, **_: Any) -> bool:
    return status.get("startMode") == "warm" and not is_terminal(status.get("phase"))


def is_deny_all(name: str | None, **_: Any) -> bool:
    return name == DENY_ALL_POLICY_NAME


@kopf.index(*PODS, labels=SANDBOX_POD_LABELS)
def sandbox_pods(
    body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, execution name) -> its pod, as last seen: the watchdog reads this."""
    return {(namespace or "", labels.get(EXECUTION_LABEL, "")): plain(body)}


@kopf.index(*NETWORK_POLICIES, labels={MANAGED_BY_LABEL: MANAGED_BY}, when=is_deny_all)
def deny_all_policies(namespace: str | None, **_: Any) -> dict[str, bool]:
    """Namespaces that have the deny-all policy, so it is created once, not per execution."""
    return {namespace or "": True}


def not_started(status: kopf.Status, type: str | None, **_: Any) -> bool:
    return not status and type != "DELETED"


def waiting_to_start(status: kopf.Status, meta: kopf.Meta, **_: Any) -> bool:
    return not status and not meta.get("deletionTimestamp")


def runs_on_a_pool_pod(status: kopf.Status, spec: kopf.Spec, **kwargs: Any) -> bool:
    return running_warm(status) and not spec.get("session") and bool(status.get("podName"))


@kopf.index(*EXECUTIONS, labels=RECONCILED, when=runs_on_a_pool_pod)
def pool_pod_runs(
    namespace: str | None, uid: str | None, status: kopf.Status, **_: Any
) -> dict[tuple[str, str], str]:
    """(namespace, pool pod name) -> the executions whose status says they run there."""
    return {(namespace or "", str(status.get("podName"))): uid or ""}


@kopf.index(*EXECUTIONS, labels=RECONCILED, when=waiting_to_start)
def unstarted_executions(
    namespace: str | None, name: str | None, uid: str | None, meta: kopf.Meta, **_: Any
) -> dict[tuple[str, str], tuple[str, str]]:
    """(namespace, name) -> (uid, creation time) of each execution last seen without a
    status: executions/resync.py looks at those that stay so."""
    return {(namespace or "", name or ""): (uid or "", meta.get("creationTimestamp") or "")}


# Before kopf's first cycle (adding its finalizer) lets on.create run: saves a round trip
# to the API server on the warm path. Not retried: the create handler does the rest.
@kopf.index(
    *EXECUTIONS,
    labels={QUEUED_LABEL: kopf.PRESENT, TENANT_LABEL: kopf.PRESENT},
    when=waiting_to_start,
)
def queued_executions(
    namespace: str | None,
    name: str | None,
    uid: str | None,
    meta: kopf.Meta,
    labels: kopf.Labels,
    **_: Any,
) -> dict[Tenant, Waiting]:
    """(namespace, tenant) -> its executions waiting in its queue."""
    entry = Waiting(
        created=meta.get("creationTimestamp") or "",
        name=name or "",
        uid=uid or "",
        limit=queue_limit(labels.get(QUEUED_LABEL)),
    )
    return {(namespace or "", labels[TENANT_LABEL]): entry}


@kopf.index(
    *EXECUTIONS,
    labels={TENANT_LABEL: kopf.PRESENT, QUEUED_LABEL: kopf.ABSENT, FINISHED_LABEL: kopf.ABSENT},
)
def running_executions(
    namespace: str | None, name: str | None, labels: kopf.Labels, **_: Any
) -> dict[Tenant, str]:
    """(namespace, tenant) -> its executions neither queued nor finished, as the gateway
    counts them against maxConcurrent."""
    return {(namespace or "", labels[TENANT_LABEL]): name or ""}


@kopf.on.event(*EXECUTIONS, labels={TENANT_LABEL: kopf.PRESENT})
def tenant_execution_changed(memo: kopf.Memo, **_: Any) -> None:
    """One queued, started or finished: the queue may let another go."""
    memo.queue.wake()


@kopf.on.event(*EXECUTIONS, labels=RECONCILED, when=not_started)
async def claim_early(
    body: kopf.Body, namespace: str | None, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any
) -> None:
    stalls_of(memo).handler_ran(body.get("metadata", {}).get("uid"))
    pools = list(index_of(kwargs, "sandbox_pools").get(namespace or "", []))
    if not pools or over_stored_bytes(memo, namespace, body.get("metadata", {}).get("name")):
        return  # the create handler ends one over its namespace's bound
    pods = list(index_of(kwargs, "pool_pods").get(namespace or "", []))
    try:
        await reconciler_of(memo).start_early(plain(body), pools=pools, pool_pods=pods)
    except (*API_ERRORS, kopf.TemporaryError, kopf.PermanentError) as error:
        logger.warning("claiming early failed, the create handler retries: %s", error)


@kopf.on.resume(*EXECUTIONS, labels=RECONCILED)
@kopf.on.create(*EXECUTIONS, labels=RECONCILED)
# Let go by its queue: kopf saw it created (queued) already, so the change is an update.
@kopf.on.update(*EXECUTIONS, labels=RECONCILED, field="metadata.labels", when=waiting_to_start)
async def start_execution(
    body: kopf.Body,
    namespace: str | None,
    name: str,
    reason: str,
    retry: int,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    reconciler = reconciler_of(memo)
    execution = plain(body)
    # A create over its namespace's stored bytes (kubectl's: the gateway's were admitted) is
    # not run; one seen again after a restart was let in before.
    refused = over_stored_bytes(memo, namespace, name) if reason == kopf.Reason.CREATE else None
    if refused is not None:
        await reconciler.record(execution, refused)
        return
    protected = bool(index_of(kwargs, "deny_all_policies").get(namespace or ""))
    pools = list(index_of(kwargs, "sandbox_pools").get(namespace or "", []))
    session = session_of(kwargs, execution)
    # A retry lists the pods afresh (the index may not show what the last attempt did).
    pods = None if retry else list(index_of(kwargs, "pool_pods").get(namespace or "", []))
    try:
        await reconciler.start(
            execution, deny_all_present=protected, pools=pools, session=session, pool_pods=pods
        )
    except API_ERRORS as error:
        if is_transient(error) and retry < START_RETRIES:
            raise kopf.TemporaryError(str(error), delay=TRANSIENT_DELAY_SECONDS) from error
        message = f"the operator could not start the sandbox: {error}"
        await reconciler.record(
            execution, Verdict("Error", "OperatorError", message, retryable=True)
        )
        raise kopf.PermanentError(message) from error


@kopf.on.event(
    *EXECUTIONS, labels=RECONCILED, annotations={CANCEL_ANNOTATION: "true"}, when=unfinished
)
async def cancel_execution(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await reconciler_of(memo).cancel(plain(body))


@kopf.on.delete(*EXECUTIONS, labels=RECONCILED, optional=True)
async def stop_deleted_execution(
    namespace: str | None, uid: str, memo: kopf.Memo, status: kopf.Status, **_: Any
) -> None:
    """Remove a deleted execution's pod at once instead of waiting for garbage collection."""
    reconciler = reconciler_of(memo)
    reconciler.forget(uid)
    kube = reconciler.kube
    # A session's pod is the session's: it stays for the session's other executions. A pool
    # pod serves its tenant's other runs: the run (if still in progress) is stopped there.
    if not namespace or not status.get("podName") or status.get("session"):
        return
    if status.get("startMode") == "warm":
        await reconciler.stop_deleted_pool_run(namespace, uid, status["podName"])
    else:
        await kube.delete_pod(namespace, status["podName"], uid=None)


@kopf.on.event(*NODES)
def node_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    stalls_of(memo).handler_ran()
    reconciler_of(memo).on_node_event(event.get("type"), dict(event["object"]))


@kopf.on.event(*PODS, labels=SANDBOX_POD_LABELS)
async def sandbox_pod_changed(
    event: kopf.RawEvent, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    try:
        await reconciler_of(memo).on_pod_event(event.get("type"), dict(event["object"]))
    except (*API_ERRORS, kopf.TemporaryError) as error:
        # Event handlers are not retried; the watchdog picks the execution up again.
        logger.warning("following the pod failed, the watchdog will retry: %s", error)


# Stopped (when the execution finishes) only between checks: a check that is recording a
# verdict and removing the pod must not be cut off half-way.
@kopf.daemon(
    *EXECUTIONS, labels=RECONCILED, when=unfinished, cancellation_backoff=30, cancellation_timeout=5
)
async def watchdog(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    """Time-based verdicts (startup timeout, unschedulable, the program's deadline) and lost
    pods, for one execution."""
    reconciler = reconciler_of(memo)
    sandbox_pods = index_of(kwargs, "sandbox_pods")
    while not stopped:
        # Each tick, or at the program's deadline if that comes first (not by ticking faster).
        await stopped.wait(reconciler.next_check_in(plain(body)))
        if stopped:
            return
        execution = plain(body)
        key = (execution["metadata"]["namespace"], execution["metadata"]["name"])
        try:
            await reconciler.watch(
                execution, list(sandbox_pods.get(key, [])), session_of(kwargs, execution)
            )
        except (*API_ERRORS, kopf.TemporaryError) as error:
            logger.warning("watchdog check failed, retrying: %s", error)


# The create handler starts the warm run itself (a task); this daemon waits for it, and
# after a restart (or when that run could not record) re-attaches to the runner (same
# executionId), which replays the run's frames instead of running it again.
@kopf.daemon(*EXECUTIONS, labels=RECONCILED, when=running_warm, cancellation_timeout=5)
async def serve_warm(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Run a warm execution in the pod it claimed and record the runner's result."""
    try:
        await reconciler_of(memo).run_warm(plain(body))
    except (*API_ERRORS, kopf.TemporaryError) as error:
        raise kopf.TemporaryError(f"recording the warm run failed: {error}", delay=1) from error


@kopf.daemon(*EXECUTIONS, labels=RECONCILED, when=finished, cancellation_timeout=5)
async def expire_finished(
    stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """Delete a finished execution ttlSecondsAfterFinished after it finished (restart-safe:
    the deadline is computed from status.finishedAt)."""
    reconciler = reconciler_of(memo)
    try:
        await reconciler.mark_finished(plain(body))
    except API_ERRORS as error:
        raise kopf.TemporaryError(f"could not label finished: {error}", delay=5) from error
    remaining = reconciler.ttl_remaining(plain(body))
    if remaining > 0:
        await stopped.wait(remaining)
    if stopped:
        return
    try:
        await reconciler.expire(plain(body))
    except API_ERRORS as error:
        raise kopf.TemporaryError(f"could not delete: {error}", delay=5) from error

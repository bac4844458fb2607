"""kopf handlers of CodeSessions (thin): start a session's pod, a daemon per live session
that runs its queue (woken at once by its pod's and its executions' events), and its end on
deletion. Registered by importing this module (sandpod_operator.handlers does)."""

from collections.abc import Mapping
from typing import Any, cast

import kopf
from sandpod_contract.names import GROUP, PLURAL, SESSION_PLURAL, VERSION

from sandpod_operator.executions.handlers import RECONCILED, plain
from sandpod_operator.executions.reconciler import Reconciler, is_transient
from sandpod_operator.kube import API_ERRORS
from sandpod_operator.sessions.controller import RESYNC_SECONDS, SessionController

SESSIONS = (GROUP, VERSION, SESSION_PLURAL)
EXECUTIONS = (GROUP, VERSION, PLURAL)
TRANSIENT_DELAY_SECONDS = 2
ERROR_DELAY_SECONDS = 10
DELETED_MESSAGE = "the session was deleted"


def sessions_of(memo: kopf.Memo) -> SessionController:
    return cast(Reconciler, memo.reconciler).sessions


def names_session(spec: kopf.Spec, **_: Any) -> bool:
    return bool(spec.get("session"))


def waiting_in_session(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    return bool(spec.get("session")) and status.get("phase") in (None, "Pending")


def live(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") != "Ended"


def executions_of(handler_kwargs: Mapping[str, Any], key: tuple[str, str]) -> list[dict[str, Any]]:
    index = cast(kopf.Index[Any, Any], handler_kwargs["session_executions"])
    return [plain(execution) for execution in index.get(key, [])]


@kopf.index(*EXECUTIONS, labels=RECONCILED, when=names_session)
def session_executions(
    body: kopf.Body, namespace: str | None, spec: kopf.Spec, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, session) -> its executions, as last seen: the session's queue."""
    return {(namespace or "", str(spec["session"])): plain(body)}


@kopf.index(*SESSIONS)
def code_sessions(
    body: kopf.Body, namespace: str | None, name: str | None, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, name) -> the session, as last seen: executions check theirs here."""
    return {(namespace or "", name or ""): plain(body)}


@kopf.on.resume(*SESSIONS)
@kopf.on.create(*SESSIONS)
async def start_session(
    body: kopf.Body, namespace: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    pools: Any = cast(kopf.Index[Any, Any], kwargs["sandbox_pools"]).get(namespace or "", [])
    deny_all: Any = cast(kopf.Index[Any, Any], kwargs["deny_all_policies"]).get(namespace or "")
    try:
        await sessions_of(memo).start(plain(body), pools=list(pools), deny_all=bool(deny_all))
    except API_ERRORS as error:
        retry = TRANSIENT_DELAY_SECONDS if is_transient(error) else ERROR_DELAY_SECONDS
        raise kopf.TemporaryError(f"starting the session failed: {error}", delay=retry) from error


@kopf.on.event(*EXECUTIONS, labels=RECONCILED, when=waiting_in_session)
async def session_execution_changed(
    namespace: str | None, spec: kopf.Spec, memo: kopf.Memo, **_: Any
) -> None:
    sessions_of(memo).wakeups.poke((namespace or "", str(spec["session"])))


@kopf.on.delete(*SESSIONS)
async def end_deleted_session(
    body: kopf.Body, namespace: str | None, name: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Ended/Deleted, its pod removed, its waiting executions ended (SessionEnded)."""
    key = (namespace or "", name or "")
    sessions = sessions_of(memo)
    try:
        await sessions.end(plain(body), "Deleted", DELETED_MESSAGE, executions_of(kwargs, key))
    except API_ERRORS as error:
        raise kopf.TemporaryError(f"ending the session failed: {error}", delay=1) from error
    sessions.forget(key, body.metadata.uid or "")


# One per live session and operator process: the only one that runs its executions, so
# they run one at a time. After a restart it re-attaches to the run at the queue's head.
# Stopped (when the session ends) only between steps: a step that is ending the session must
# get to delete its pod and refuse the executions still waiting.
@kopf.daemon(*SESSIONS, when=live, cancellation_backoff=30, cancellation_timeout=5)
async def serve_session(
    stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, **kwargs: Any
) -> None:
    sessions = sessions_of(memo)
    key = (body.metadata.namespace or "", body.metadata.name or "")
    while not stopped:
        try:
            wait = await sessions.tick(plain(body), executions_of(kwargs, key))
        except (*API_ERRORS, kopf.TemporaryError) as error:
            kopf_logger = kwargs["logger"]
            kopf_logger.warning("session step failed, retrying: %s", error)
            wait = TRANSIENT_DELAY_SECONDS
        if wait > 0:
            await sessions.wakeups.wait(key, min(wait, RESYNC_SECONDS))

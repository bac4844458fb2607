"""The admission ledger's part in kopf: the indices it counts from, its start with the
operator, and the check of a create made over its namespace's stored bytes. Registered by
importing this module (sandpod_operator.handlers does)."""

from collections.abc import Mapping
from typing import Any, cast

import kopf
from sandpod_contract.names import GROUP, PLURAL, SESSION_PLURAL, TENANT_LABEL, VERSION

from sandpod_operator.admission.ledger import (
    ExecutionUse,
    Ledger,
    SessionUse,
    execution_use,
    over_bound_verdict,
)
from sandpod_operator.settings import OperatorSettings
from sandpod_operator.status import Verdict

EXECUTIONS = (GROUP, VERSION, PLURAL)
SESSIONS = (GROUP, VERSION, SESSION_PLURAL)


def ledger_of(memo: kopf.Memo) -> Ledger:
    return cast(Ledger, memo.ledger)


def start_ledger(
    memo: kopf.Memo, sandpod: OperatorSettings, handler_kwargs: Mapping[str, Any]
) -> None:
    """The ledger over the indices below, and each tenant namespace's bound."""
    executions = cast(kopf.Index[str, ExecutionUse], handler_kwargs["execution_uses"])
    sessions = cast(kopf.Index[str, SessionUse], handler_kwargs["session_uses"])
    memo.ledger = Ledger(
        executions=lambda namespace: executions.get(namespace, []),
        sessions=lambda namespace: sessions.get(namespace, []),
        hold_seconds=sandpod.admission_hold_seconds,
    )
    memo.stored_bytes_bounds = sandpod.stored_bytes_bounds()


def over_stored_bytes(memo: kopf.Memo, namespace: str | None, name: str | None) -> Verdict | None:
    """The verdict of an execution created over its namespace's stored bytes, else None."""
    bounds = cast(dict[str, int], memo.stored_bytes_bounds)
    return over_bound_verdict(ledger_of(memo), bounds, namespace or "", name or "")


@kopf.index(*EXECUTIONS)
def execution_uses(
    namespace: str | None,
    name: str | None,
    labels: kopf.Labels,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    **_: Any,
) -> dict[str, ExecutionUse]:
    """namespace -> what each execution takes of it (the admission ledger counts these)."""
    use = execution_use(name or "", labels, meta, dict(spec), dict(status))
    return {namespace or "": use}


@kopf.index(*SESSIONS)
def session_uses(
    namespace: str | None, name: str | None, labels: kopf.Labels, status: kopf.Status, **_: Any
) -> dict[str, SessionUse]:
    """namespace -> its sessions, ended or not (the admission ledger counts these)."""
    live = status.get("phase") != "Ended"
    return {namespace or "": SessionUse(name or "", labels.get(TENANT_LABEL, ""), live)}

"""A tenant's counts, kept in memory from the operator's watches, and the one decision on
whether it may create another execution or session. The gateway's replicas all ask here
(endpoint.py), so a limit holds across them without a lock or a LIST.

What an index does not show yet (a create this ledger admitted a moment ago, whose object the
watch has not delivered) is held as a reservation until the object appears, or for
`hold_seconds` at most.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sandpod_contract.models import is_terminal
from sandpod_contract.names import FINISHED_LABEL, TENANT_LABEL

from sandpod_operator.status import Verdict

Kind = Literal["execution", "session"]
LimitName = Literal["maxConcurrent", "maxSessions", "maxStoredBytes"]

# How long the ledger remembers that it admitted an execution: the start of a create it
# admitted is not checked against the namespace's bound again (it was, when admitted).
ADMITTED_MEMORY_SECONDS = 600.0
# How long the ledger remembers that the operator labelled an execution finished: long
# enough for the watch to deliver that label to the index it counts from.
FINISHED_MEMORY_SECONDS = 120.0
STORED_BYTES_REASON = "StoredBytesLimit"


@dataclass(frozen=True)
class ExecutionUse:
    """What one execution takes of its namespace, as last seen."""

    name: str
    tenant: str
    unfinished: bool
    stored_bytes: int
    created: str = ""


@dataclass(frozen=True)
class SessionUse:
    name: str
    tenant: str
    live: bool


def stored_bytes(spec: Mapping[str, Any], status: Mapping[str, Any]) -> int:
    """Bytes an execution keeps in etcd: its spec and status as JSON (sources, files, stdin,
    kept stdout and stderr, diagnostics), and its stored output files (their ConfigMap)."""
    size = len(json.dumps(spec, separators=(",", ":")).encode())
    size += len(json.dumps(status, separators=(",", ":")).encode()) if status else 0
    for entry in status.get("outputs") or []:
        kept = entry.get("size") if isinstance(entry, dict) and entry.get("stored") else None
        size += kept if isinstance(kept, int) else 0
    return size


def execution_use(
    name: str,
    labels: Mapping[str, str],
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
) -> ExecutionUse:
    """An execution is finished once its phase is terminal or the operator has labelled it
    finished (a direct run's record carries that label from its creation)."""
    finished = is_terminal(status.get("phase")) or labels.get(FINISHED_LABEL) == "true"
    return ExecutionUse(
        name=name,
        tenant=labels.get(TENANT_LABEL, ""),
        unfinished=not finished,
        stored_bytes=stored_bytes(spec, status),
        created=str(meta.get("creationTimestamp") or ""),
    )


@dataclass(frozen=True)
class Usage:
    """A tenant's executions not finished and sessions not ended, and the bytes its
    namespace keeps; `oldest_running`: the creation time of its oldest unfinished one."""

    running: int
    sessions: int
    stored_bytes: int
    oldest_running: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "sessions": self.sessions,
            "storedBytes": self.stored_bytes,
            "oldestRunning": self.oldest_running,
        }


@dataclass(frozen=True)
class Ask:
    """A create the gateway asks to admit, with the tenant's limits."""

    namespace: str
    tenant: str
    kind: Kind
    name: str
    stored_bytes: int
    max_concurrent: int
    max_sessions: int
    max_stored_bytes: int


@dataclass(frozen=True)
class Refusal:
    limit: LimitName
    value: int
    usage: Usage


@dataclass
class _Reservation:
    tenant: str
    stored_bytes: int
    expires: float


@dataclass
class Ledger:
    """Counts from `executions` and `sessions` (namespace -> what the watches last saw) plus
    reservations for admitted creates not seen yet."""

    executions: Callable[[str], Iterable[ExecutionUse]]
    sessions: Callable[[str], Iterable[SessionUse]]
    hold_seconds: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _held: dict[tuple[str, Kind, str], _Reservation] = field(default_factory=dict)
    _admitted: dict[tuple[str, str], float] = field(default_factory=dict)
    _finished: dict[tuple[str, str], float] = field(default_factory=dict)

    def usage(self, namespace: str, tenant: str, leaving_out: str | None = None) -> Usage:
        """The tenant's use (`leaving_out`: a name whose reservation is not counted)."""
        now = self.clock()
        executions = list(self.executions(namespace))
        sessions = list(self.sessions(namespace))
        seen: dict[Kind, set[str]] = {
            "execution": {use.name for use in executions},
            "session": {use.name for use in sessions},
        }
        for key, reservation in list(self._held.items()):
            if key[0] == namespace and (reservation.expires <= now or key[2] in seen[key[1]]):
                del self._held[key]
        self._finished = {key: until for key, until in self._finished.items() if until > now}
        running = [
            use
            for use in executions
            if use.tenant == tenant
            and use.unfinished
            and (namespace, use.name) not in self._finished
        ]
        held = {
            (kind, name): reservation
            for (space, kind, name), reservation in self._held.items()
            if space == namespace and name != leaving_out
        }
        return Usage(
            running=len(running)
            + sum(1 for (kind, _), r in held.items() if kind == "execution" and r.tenant == tenant),
            sessions=sum(1 for use in sessions if use.tenant == tenant and use.live)
            + sum(1 for (kind, _), r in held.items() if kind == "session" and r.tenant == tenant),
            stored_bytes=sum(use.stored_bytes for use in executions)
            + sum(r.stored_bytes for r in held.values()),
            oldest_running=min((use.created for use in running if use.created), default=None),
        )

    def admit(self, ask: Ask) -> Refusal | None:
        """Admit `ask` (held until its object appears), or the limit it would pass."""
        usage = self.usage(ask.namespace, ask.tenant, leaving_out=ask.name)
        refusal = _refusal(ask, usage)
        if refusal is not None:
            return refusal
        now = self.clock()
        self._held[(ask.namespace, ask.kind, ask.name)] = _Reservation(
            ask.tenant, ask.stored_bytes, now + self.hold_seconds
        )
        if ask.kind == "execution":
            self._admitted = {key: until for key, until in self._admitted.items() if until > now}
            self._admitted[(ask.namespace, ask.name)] = now + ADMITTED_MEMORY_SECONDS
        return None

    def finished(self, namespace: str, name: str) -> None:
        """The operator has just labelled execution `name` finished: it no longer counts as
        running, even before the watch delivers that label."""
        self._finished[(namespace, name)] = self.clock() + FINISHED_MEMORY_SECONDS

    def admitted(self, namespace: str, name: str) -> bool:
        """Whether this ledger admitted execution `name` lately."""
        return self._admitted.get((namespace, name), 0.0) > self.clock()

    def over_bound(self, namespace: str, bound: int) -> int | None:
        """The bytes `namespace` keeps when that is over `bound`, else None."""
        kept = sum(use.stored_bytes for use in self.executions(namespace))
        return kept if kept > bound else None


def _refusal(ask: Ask, usage: Usage) -> Refusal | None:
    if ask.kind == "session":
        if usage.sessions + 1 > ask.max_sessions:
            return Refusal("maxSessions", ask.max_sessions, usage)
        return None
    if usage.running + 1 > ask.max_concurrent:
        return Refusal("maxConcurrent", ask.max_concurrent, usage)
    if usage.stored_bytes + ask.stored_bytes > ask.max_stored_bytes:
        return Refusal("maxStoredBytes", ask.max_stored_bytes, usage)
    return None


def over_bound_verdict(
    ledger: Ledger, bounds: Mapping[str, int], namespace: str, name: str
) -> Verdict | None:
    """The verdict of an execution created (not through the gateway, which the ledger
    admitted) while its namespace keeps more than its bound, which is not run; else None."""
    bound = bounds.get(namespace)
    if bound is None or ledger.admitted(namespace, name):
        return None
    kept = ledger.over_bound(namespace, bound)
    if kept is None:
        return None
    return Verdict(
        "Failed",
        STORED_BYTES_REASON,
        f"Not run: the executions of namespace {namespace} keep {kept} bytes, over its bound "
        f"maxStoredBytes={bound}; delete finished ones or wait for them to expire.",
        retryable=True,
    )

"""The operator's admission ledger (sandpod_operator/admission): a tenant's counts from what
the watches saw plus reservations for admitted creates not seen yet, and the bound on the
bytes a namespace keeps for creates that did not come through the gateway."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from kopf import Body
from sandpod_operator.admission.endpoint import parse_ask
from sandpod_operator.admission.handlers import execution_uses
from sandpod_operator.admission.ledger import (
    STORED_BYTES_REASON,
    Ask,
    ExecutionUse,
    Ledger,
    SessionUse,
    execution_use,
    over_bound_verdict,
    stored_bytes,
)


@dataclass
class Seen:
    """What the operator's indices hold, namespace -> uses, and a clock to move."""

    executions: dict[str, list[ExecutionUse]] = field(default_factory=dict)
    sessions: dict[str, list[SessionUse]] = field(default_factory=dict)
    now: float = 1000.0

    def ledger(self) -> Ledger:
        return Ledger(
            executions=lambda namespace: self.executions.get(namespace, []),
            sessions=lambda namespace: self.sessions.get(namespace, []),
            hold_seconds=5.0,
            clock=lambda: self.now,
        )


def ask(name: str, kind: str = "execution", stored: int = 100, **limits: int) -> Ask:
    return Ask(
        namespace="ns",
        tenant="alice",
        kind="session" if kind == "session" else "execution",
        name=name,
        stored_bytes=stored,
        max_concurrent=limits.get("max_concurrent", 2),
        max_sessions=limits.get("max_sessions", 1),
        max_stored_bytes=limits.get("max_stored_bytes", 10_000),
    )


def running(name: str, tenant: str = "alice", size: int = 100) -> ExecutionUse:
    return ExecutionUse(name, tenant, True, size, "2026-11-26T10:00:00Z")


def test_admitted_creates_count_until_their_objects_are_seen() -> None:
    seen = Seen()
    ledger = seen.ledger()

    assert ledger.admit(ask("a")) is None
    assert ledger.admit(ask("b")) is None
    refused = ledger.admit(ask("c"))

    assert refused is not None and (refused.limit, refused.value) == ("maxConcurrent", 2)
    assert refused.usage.running == 2
    # Seen: counted once, as the object; finished: no longer counted.
    seen.executions["ns"] = [running("a"), running("b")]
    assert ledger.usage("ns", "alice").running == 2
    seen.executions["ns"] = [ExecutionUse("a", "alice", False, 100), running("b")]
    assert ledger.admit(ask("c")) is None


def test_a_reservation_not_seen_lapses_after_the_hold() -> None:
    seen = Seen()
    ledger = seen.ledger()
    assert ledger.admit(ask("a", max_concurrent=1)) is None
    assert ledger.admit(ask("b", max_concurrent=1)) is not None

    seen.now += 5.0

    assert ledger.admit(ask("b", max_concurrent=1)) is None


def test_asking_again_for_the_same_name_counts_it_once() -> None:
    ledger = Seen().ledger()

    assert ledger.admit(ask("a", max_concurrent=1)) is None
    assert ledger.admit(ask("a", max_concurrent=1)) is None
    assert ledger.usage("ns", "alice").running == 1


def test_tenants_are_counted_apart_and_bytes_by_namespace() -> None:
    seen = Seen(executions={"ns": [running("x", tenant="bob", size=9_000)]})
    ledger = seen.ledger()

    assert ledger.usage("ns", "alice").running == 0
    refused = ledger.admit(ask("a", stored=2_000))

    assert refused is not None and (refused.limit, refused.value) == ("maxStoredBytes", 10_000)
    assert refused.usage.stored_bytes == 9_000
    assert ledger.admit(ask("a", stored=1_000)) is None
    assert ledger.usage("ns", "bob").stored_bytes == 10_000


def test_sessions_count_until_they_end() -> None:
    seen = Seen(sessions={"ns": [SessionUse("s1", "alice", live=True)]})
    ledger = seen.ledger()

    refused = ledger.admit(ask("s2", kind="session"))

    assert refused is not None and refused.limit == "maxSessions"
    seen.sessions["ns"] = [SessionUse("s1", "alice", live=False)]
    assert ledger.admit(ask("s2", kind="session")) is None
    assert ledger.admit(ask("s3", kind="session")) is not None


def test_stored_bytes_are_spec_and_status_and_stored_outputs() -> None:
    spec = {"source": "x" * 1000}
    status = {
        "phase": "Succeeded",
        "stdout": "y" * 500,
        "outputs": [
            {"path": "a.png", "size": 4000, "stored": True},
            {"path": "b.bin", "size": 9_000_000, "stored": False},
        ],
    }

    size = stored_bytes(spec, status)

    assert 1000 + 500 + 4000 < size < 1000 + 500 + 4000 + 300
    use = execution_use("a", {"sandpod.dev/tenant": "alice"}, {}, spec, {})
    assert (use.tenant, use.unfinished) == ("alice", True)


def test_an_execution_labelled_finished_is_not_running_whatever_its_phase() -> None:
    labels = {"sandpod.dev/tenant": "alice", "sandpod.dev/finished": "true"}

    direct_record = execution_use("d", labels, {}, {"source": "1"}, {"phase": "Running"})

    assert direct_record.unfinished is False


def test_an_execution_the_operator_labelled_finished_stops_counting_before_the_watch_says_so() -> (
    None
):
    seen = Seen(executions={"ns": [running("a")]})
    ledger = seen.ledger()
    assert ledger.admit(ask("b", max_concurrent=1)) is not None

    ledger.finished("ns", "a")

    assert ledger.usage("ns", "alice").running == 0
    assert ledger.admit(ask("b", max_concurrent=1)) is None


def test_a_create_over_the_namespace_bound_is_not_run_unless_it_was_admitted() -> None:
    seen = Seen(executions={"ns": [running("old", size=6_000), running("new", size=5_000)]})
    ledger = seen.ledger()

    verdict = over_bound_verdict(ledger, {"ns": 10_000}, "ns", "new")

    assert verdict is not None
    assert (verdict.phase, verdict.reason) == ("Failed", STORED_BYTES_REASON)
    assert "maxStoredBytes=10000" in verdict.message and "11000" in verdict.message
    assert over_bound_verdict(ledger, {"ns": 20_000}, "ns", "new") is None
    assert over_bound_verdict(ledger, {}, "ns", "new") is None
    # What the gateway had admitted was checked then: it runs.
    assert (
        ledger.admit(ask("admitted", stored=0, max_concurrent=3, max_stored_bytes=20_000)) is None
    )
    assert over_bound_verdict(ledger, {"ns": 10_000}, "ns", "admitted") is None


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"namespace": "ns", "tenant": "t", "kind": "execution", "name": "a", "storedBytes": 1},
        {
            "namespace": "ns",
            "tenant": "t",
            "kind": "pod",
            "name": "a",
            "storedBytes": 1,
            "limits": {"maxConcurrent": 1, "maxSessions": 1, "maxStoredBytes": 1},
        },
        {
            "namespace": "ns",
            "tenant": "t",
            "kind": "execution",
            "name": "a",
            "storedBytes": -1,
            "limits": {"maxConcurrent": 1, "maxSessions": 1, "maxStoredBytes": 1},
        },
        {
            "namespace": "",
            "tenant": "t",
            "kind": "execution",
            "name": "a",
            "storedBytes": 1,
            "limits": {"maxConcurrent": True, "maxSessions": 1, "maxStoredBytes": 1},
        },
    ],
)
def test_a_malformed_ask_is_refused(body: object) -> None:
    assert parse_ask(body) is None


def test_a_well_formed_ask_is_read() -> None:
    body = {
        "namespace": "ns",
        "tenant": "alice",
        "kind": "session",
        "name": "s1",
        "storedBytes": 0,
        "limits": {"maxConcurrent": 2, "maxSessions": 1, "maxStoredBytes": 10_000},
    }

    assert parse_ask(body) == ask("s1", kind="session", stored=0)


def test_the_index_reads_kopfs_views_of_an_execution() -> None:
    body = Body(
        {
            "metadata": {
                "name": "a",
                "namespace": "ns",
                "labels": {"sandpod.dev/tenant": "alice"},
                "creationTimestamp": "2026-11-26T10:00:00Z",
            },
            "spec": {"language": "python", "source": "print(1)"},
            "status": {"phase": "Succeeded", "outputs": [{"size": 10, "stored": True}]},
        }
    )

    indexed = execution_uses(
        namespace="ns",
        name="a",
        labels=body.metadata.labels,
        meta=body.metadata,
        spec=body.spec,
        status=body.status,
    )

    use = indexed["ns"]
    assert (use.name, use.tenant, use.unfinished, use.created) == (
        "a",
        "alice",
        False,
        "2026-11-26T10:00:00Z",
    )
    assert use.stored_bytes == stored_bytes(dict(body.spec), dict(body.status))

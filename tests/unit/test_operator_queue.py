"""The executions queue's choice of what to start: per tenant within its limit, oldest first,
round-robin between tenants."""

from sandpod_operator.executions.queue import Waiting, queue_limit, releases

A = ("class-a", "alice")
B = ("class-b", "bob")


def waiting(tenant: str, count: int, limit: int, start: int = 0) -> list[Waiting]:
    return [
        Waiting(
            created=f"2026-11-26T14:00:{start + i:02d}Z",
            name=f"{tenant}-{i}",
            uid=f"{tenant}-{i}",
            limit=limit,
        )
        for i in range(count)
    ]


def test_a_tenant_gets_as_many_as_it_has_room_for_oldest_first() -> None:
    queue = waiting("a", 5, limit=3)
    chosen = releases({A: list(reversed(queue))}, {A: 1}, released=[])
    assert [entry.name for _, entry in chosen] == ["a-0", "a-1"]
    assert releases({A: queue}, {A: 3}, released=[]) == []


def test_released_but_still_shown_queued_counts_as_running() -> None:
    queue = waiting("a", 5, limit=3)
    chosen = releases({A: queue}, {A: 0}, released=["a-0", "a-1"])
    assert [entry.name for _, entry in chosen] == ["a-2"]


def test_tenants_take_turns_and_one_backlog_never_holds_another_back() -> None:
    # Alice queued 100 first; Bob's 3 still start now, interleaved with hers.
    queues = {A: waiting("a", 100, limit=3), B: waiting("b", 3, limit=3, start=30)}
    chosen = releases(queues, {A: 0, B: 0}, released=[])
    assert [(tenant, entry.name) for tenant, entry in chosen] == [
        (A, "a-0"),
        (B, "b-0"),
        (A, "a-1"),
        (B, "b-1"),
        (A, "a-2"),
        (B, "b-2"),
    ]
    busy = releases(queues, {A: 3, B: 1}, released=[])
    assert [(tenant, entry.name) for tenant, entry in busy] == [(B, "b-0"), (B, "b-1")]


def test_the_limit_comes_from_the_label_and_a_bad_one_is_one() -> None:
    assert [queue_limit(value) for value in ("5", "0", "-2", "x", "", None)] == [5, 1, 1, 1, 1, 1]

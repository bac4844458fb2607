"""Which executions the resync touches (operator/sandpod_operator/executions/resync.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sandpod_operator.executions.resync import due

NOW = datetime(2026, 11, 25, 22, 0, 0, tzinfo=UTC)
AFTER = timedelta(seconds=30)


def test_only_those_unstarted_for_long_enough_are_due() -> None:
    seen = {
        ("team", "old"): [("uid-old", "2026-11-25T21:59:00Z")],
        ("team", "new"): [("uid-new", "2026-11-25T21:59:45Z")],
        ("team", "exactly"): [("uid-exactly", "2026-11-25T21:59:30Z")],
    }
    assert due(seen, NOW, AFTER) == [("team", "old", "uid-old"), ("team", "exactly", "uid-exactly")]


def test_nothing_seen_or_no_creation_time_is_not_due() -> None:
    assert due({}, NOW, AFTER) == []
    assert due({("team", "x"): [("uid", "")]}, NOW, AFTER) == []

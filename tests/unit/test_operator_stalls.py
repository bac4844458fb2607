"""When the operator's liveness probe says kopf runs no handlers
(sandpod_operator/executions/stalls.py)."""

from __future__ import annotations

from fake_clock import FakeClock
from sandpod_operator.executions.stalls import StallDetector


def test_no_handler_since_the_start_is_a_stall_once_the_time_is_up(clock: FakeClock) -> None:
    detector = StallDetector(60, clock)
    clock.advance(59)
    assert detector.stalled() is None
    clock.advance(1)
    assert detector.stalled() == "no handler has run in the 60 s since the operator started"


def test_a_handler_run_before_the_time_is_up_is_no_stall(clock: FakeClock) -> None:
    detector = StallDetector(60, clock)
    detector.handler_ran()
    clock.advance(600)
    assert detector.stalled() is None


def test_a_touched_execution_no_handler_saw_is_a_stall(clock: FakeClock) -> None:
    detector = StallDetector(30, clock)
    detector.handler_ran()
    detector.touched("uid-1")
    clock.advance(29)
    assert detector.stalled() is None
    clock.advance(1)
    assert detector.stalled() == "no handler saw execution uid-1 in the 30 s since its touch"


def test_a_touched_execution_a_handler_saw_is_no_stall(clock: FakeClock) -> None:
    detector = StallDetector(30, clock)
    detector.touched("uid-1")
    detector.handler_ran("uid-1")
    clock.advance(300)
    assert detector.stalled() is None


def test_a_second_touch_keeps_the_first_touch_time(clock: FakeClock) -> None:
    detector = StallDetector(30, clock)
    detector.handler_ran()
    detector.touched("uid-1")
    clock.advance(20)
    detector.touched("uid-1")
    clock.advance(10)
    assert detector.stalled() is not None

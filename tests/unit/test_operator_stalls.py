"""When the operator's liveness probe says kopf runs no handlers
(sandpod_operator/executions/stalls.py)."""

from __future__ import annotations

from sandpod_operator.executions.stalls import StallDetector


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_no_handler_since_the_start_is_a_stall_once_the_time_is_up() -> None:
    clock = Clock()
    detector = StallDetector(60, clock)
    clock.now += 59
    assert detector.stalled() is None
    clock.now += 1
    assert detector.stalled() == "no handler has run in the 60 s since the operator started"


def test_a_handler_run_before_the_time_is_up_is_no_stall() -> None:
    clock = Clock()
    detector = StallDetector(60, clock)
    detector.handler_ran()
    clock.now += 600
    assert detector.stalled() is None


def test_a_touched_execution_no_handler_saw_is_a_stall() -> None:
    clock = Clock()
    detector = StallDetector(30, clock)
    detector.handler_ran()
    detector.touched("uid-1")
    clock.now += 29
    assert detector.stalled() is None
    clock.now += 1
    assert detector.stalled() == "no handler saw execution uid-1 in the 30 s since its touch"


def test_a_touched_execution_a_handler_saw_is_no_stall() -> None:
    clock = Clock()
    detector = StallDetector(30, clock)
    detector.touched("uid-1")
    detector.handler_ran("uid-1")
    clock.now += 300
    assert detector.stalled() is None


def test_a_second_touch_keeps_the_first_touch_time() -> None:
    clock = Clock()
    detector = StallDetector(30, clock)
    detector.handler_ran()
    detector.touched("uid-1")
    clock.now += 20
    detector.touched("uid-1")
    clock.now += 10
    assert detector.stalled() is not None

"""A monotonic clock for the code under test that moves only when the test says so."""


class FakeClock:
    """Seconds on a monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

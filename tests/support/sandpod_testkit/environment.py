"""Settings come from SANDPOD_* variables: unit tests start from none of them."""

import os

import pytest


def clear_sandpod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset every SANDPOD_* variable for this test, so settings take their defaults."""
    for name in [name for name in os.environ if name.startswith("SANDPOD_")]:
        monkeypatch.delenv(name)

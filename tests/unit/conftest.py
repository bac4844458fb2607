"""Fixtures several unit test modules share; a module defines its own to differ."""

import pytest
from fake_clock import FakeClock
from fake_kube import FakeKube
from gateway_fakes import FakeExecutionService, FakeSessionService
from sandpod_contract.catalog import Catalog, load_catalog
from sandpod_testkit.environment import clear_sandpod_environment


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SANDPOD_* variables: settings take their defaults (modules opt in with usefixtures)."""
    clear_sandpod_environment(monkeypatch)


@pytest.fixture
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture
def clock() -> FakeClock:
    """A clock at 1000 s that moves only when the test moves it."""
    return FakeClock()


@pytest.fixture
def kube() -> FakeKube:
    """The in-memory fake of the operator's Kubernetes surface."""
    return FakeKube()


@pytest.fixture
def service() -> FakeExecutionService:
    return FakeExecutionService()


@pytest.fixture
def sessions() -> FakeSessionService:
    return FakeSessionService()

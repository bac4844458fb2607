"""The e2b section's pure parts: it runs by default, and a create's time to its return."""

from sandpod_bench.main import parse_options
from sandpod_bench.sections.e2b import created_only
from sandpod_bench.workloads import Attempt, e2b_options


def test_the_e2b_section_runs_by_default() -> None:
    assert "e2b" in parse_options([]).sections


def test_a_create_is_timed_to_when_it_returned() -> None:
    attempts = [
        Attempt(True, 0.9, "s-1", None, {"created": 0.2}),
        Attempt(False, 5.0, "s-2", "text None", {"created": 0.3}),
        Attempt(False, 0.1, error="ConnectError"),  # create itself failed: nothing returned
    ]
    assert created_only(attempts) == [
        Attempt(True, 0.2, "s-1"),
        Attempt(False, 0.3, "s-2", "text None"),
    ]


def test_the_sdk_is_pointed_at_the_gateways_e2b_api() -> None:
    assert e2b_options("http://gw", "sk-1") == {
        "api_key": "sk-1",
        "api_url": "http://gw/e2b",
        "sandbox_url": "http://gw/e2b/sandbox",
    }

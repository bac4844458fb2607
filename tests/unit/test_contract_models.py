from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError
from sandpod_contract.models import (
    MAX_CONTENT_CHARS,
    CodeExecutionSpec,
    CodeExecutionStatus,
    execution_name_problem,
)
from sandpod_contract.quantities import QuantityBounds, parse_quantity


def spec(**fields: Any) -> CodeExecutionSpec:
    return CodeExecutionSpec.model_validate({"language": "python", "source": "print(1)", **fields})


def test_defaults_and_camel_case_round_trip() -> None:
    parsed = spec()
    assert parsed.mode == "run"
    assert parsed.timeout_seconds == 10
    assert parsed.max_output_bytes == 1024 * 1024
    assert parsed.network.egress == "none"
    assert parsed.ttl_seconds_after_finished is None
    dumped = spec(timeoutSeconds=5, maxOutputBytes=2048).model_dump(by_alias=True)
    assert dumped["timeoutSeconds"] == 5
    assert dumped["maxOutputBytes"] == 2048


def test_quantities_accept_yaml_numbers_and_suffixes() -> None:
    parsed = spec(resources={"cpu": 1, "memory": "512Mi", "ephemeralStorage": "1Gi"})
    assert parsed.resources.cpu == "1"
    assert parsed.resources.memory == "512Mi"


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"cpu": "32"}, "cpu must be a quantity between 10m and 16"),
        ({"cpu": "1m"}, "cpu must be a quantity between 10m and 16"),
        ({"memory": "lots"}, "memory must be a quantity between 16Mi and 64Gi"),
        ({"memory": "128Gi"}, "memory must be a quantity between 16Mi and 64Gi"),
        ({"ephemeralStorage": "1Ti"}, "ephemeral storage must be a quantity"),
    ],
)
def test_quantities_out_of_bounds_are_refused(resources: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        spec(resources=resources)


@pytest.mark.parametrize(
    ("fields", "location"),
    [
        ({"language": "Python"}, "language"),
        ({"timeoutSeconds": 0}, "timeoutSeconds"),
        ({"timeoutSeconds": 301}, "timeoutSeconds"),
        ({"maxOutputBytes": 10}, "maxOutputBytes"),
        ({"ttlSecondsAfterFinished": -1}, "ttlSecondsAfterFinished"),
        ({"mode": "compile"}, "mode"),
        ({"unknownField": 1}, "unknownField"),
        ({"args": ["x"] * 65}, "args"),
        ({"runtimeClassName": "Not_A_Name"}, "runtimeClassName"),
    ],
)
def test_bounds_name_the_field(fields: dict[str, Any], location: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(**fields)
    assert location in str(caught.value)


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../b", ".env", "a//b", "a/", ""])
def test_file_paths_must_be_plain_relative(path: str) -> None:
    with pytest.raises(ValidationError):
        spec(files=[{"path": path, "content": ""}])


def test_file_paths_must_be_unique() -> None:
    with pytest.raises(ValidationError, match=r"duplicate file paths: a\.txt"):
        spec(files=[{"path": "a.txt", "content": "1"}, {"path": "a.txt", "content": "2"}])
    assert len(spec(files=[{"path": "data/in.csv", "content": "1,2"}]).files) == 1


def test_total_content_is_bounded() -> None:
    half = "x" * (MAX_CONTENT_CHARS // 2)
    spec(source=half, stdin=half)
    with pytest.raises(ValidationError, match="must not exceed"):
        spec(source=half, stdin=half, files=[{"path": "f", "content": "x"}])


def test_network_allowlist_needs_destinations() -> None:
    allowed = spec(network={"egress": "allowlist", "allow": [{"cidr": "203.0.113.0/24"}]})
    assert allowed.network.allow[0].ports == []
    with pytest.raises(ValidationError, match=r"network\.allow must be non-empty"):
        spec(network={"egress": "allowlist"})
    with pytest.raises(ValidationError, match=r"network\.allow must be non-empty"):
        spec(network={"egress": "none", "allow": [{"cidr": "10.0.0.0/8"}]})
    with pytest.raises(ValidationError, match="CIDR"):
        spec(network={"egress": "allowlist", "allow": [{"cidr": "10.0.0.1/8"}]})


def test_execution_names_must_be_dns_labels() -> None:
    assert execution_name_problem("hello-1") is None
    assert execution_name_problem("a" * 64) is not None
    assert execution_name_problem("a.b") is not None


def test_status_model_reads_what_the_operator_writes() -> None:
    status = CodeExecutionStatus.model_validate(
        {
            "phase": "Succeeded",
            "exitCode": 0,
            "startedAt": "2025-01-01T00:00:00Z",
            "conditions": [
                {
                    "type": "Completed",
                    "status": "True",
                    "reason": "Completed",
                    "lastTransitionTime": "2025-01-01T00:00:01Z",
                }
            ],
            "diagnostics": [{"code": "F401", "message": "unused", "line": 1, "extra": True}],
        }
    )
    assert status.exit_code == 0
    assert status.diagnostics is not None and status.diagnostics[0].code == "F401"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1.5", Decimal("1.5")),
        ("256Mi", Decimal(256 * 2**20)),
        ("1G", Decimal(10**9)),
        ("1e3", Decimal(1000)),
        (".5Ki", Decimal(512)),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "-1", "1.2.3", "1Mb", "Mi", "1 Gi"])
def test_parse_quantity_refuses_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not a resource quantity"):
        parse_quantity(text)


def test_quantity_bounds_cel_rule_mentions_both_ends() -> None:
    rule = QuantityBounds(minimum="10m", maximum="16").cel_rule()
    assert "quantity('10m')" in rule and "quantity('16')" in rule
    assert rule.startswith("isQuantity(string(self))")

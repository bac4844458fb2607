"""Pure parts of the gateway: manifests, result mapping, runner frames, API keys."""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import runner_wire
from pydantic import BaseModel
from sandpod_contract.catalog import DEFAULT_CATALOG_PATH
from sandpod_contract.models import (
    DEFAULT_IDLE_TIMEOUT_SECONDS,
    DEFAULT_MAX_LIFETIME_SECONDS,
    MAX_TIMEOUT_SECONDS,
    CodeExecutionSpec,
    CodeExecutionStatus,
    CodeSessionSpec,
    execution_name_problem,
)
from sandpod_contract.names import API_VERSION, KIND, REQUEST_HASH_ANNOTATION, TENANT_LABEL
from sandpod_contract.runner import MAX_FRAME_BYTES, FrameDecoder, OutputChunk, decode_frame
from sandpod_gateway.families.mcp.mcp_server import build_mcp_server
from sandpod_gateway.families.tools.openai_tools import tool_parameters
from sandpod_gateway.kube.kube_service import LOG_SINCE_SLACK_SECONDS, LogFollow, log_follow
from sandpod_gateway.kube.resources import (
    build_code_execution,
    execution_result,
    read_status,
    request_fingerprint,
)
from sandpod_gateway.languages import load_language_catalog
from sandpod_gateway.policy.admission import retry_after_seconds
from sandpod_gateway.policy.auth import KeyIndex, TenantLimits, hash_api_key, parse_tenants_config
from sandpod_gateway.policy.idempotency import execution_name
from sandpod_gateway.schemas import CreateExecutionRequest, CreateSessionRequest, ExecutionStatus
from sandpod_gateway.usecases.tool_definitions import (
    OPEN_SESSION,
    RUN_CODE,
    RUN_IN_SESSION,
    TOOLS,
    ToolDefinition,
)
from sandpod_gateway.web.errors import GatewayError, format_location


def request(**fields: Any) -> CreateExecutionRequest:
    return CreateExecutionRequest.model_validate(
        {"language": "python", "code": "print(1)", **fields}
    )


def manifest(req: CreateExecutionRequest, **overrides: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": "cx-1",
        "tenant": "team-a",
        "request": req,
        "timeout_seconds": 10,
        "memory": "256Mi",
        "cpu": "500m",
        "ttl_seconds_after_finished": 600,
    }
    return build_code_execution(**{**options, **overrides})


# --- request bounds ---------------------------------------------------------------------


BOUNDS = ("minimum", "maximum", "minLength", "maxLength", "maxItems")


def bounds_of(model: type[BaseModel], field: str) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=False)["properties"][field]
    # An optional request field: its bounds are on the non-null branch.
    branches = schema.get("anyOf", [schema])
    return {key: value for branch in branches for key, value in branch.items() if key in BOUNDS}


@pytest.mark.parametrize(
    ("request_model", "request_field", "spec_model", "spec_field"),
    [
        (CreateExecutionRequest, "timeout_seconds", CodeExecutionSpec, "timeout_seconds"),
        (CreateExecutionRequest, "max_output_bytes", CodeExecutionSpec, "max_output_bytes"),
        (CreateExecutionRequest, "args", CodeExecutionSpec, "args"),
        (CreateExecutionRequest, "files", CodeExecutionSpec, "files"),
        (CreateSessionRequest, "idle_timeout_seconds", CodeSessionSpec, "idle_timeout_seconds"),
        (CreateSessionRequest, "max_lifetime_seconds", CodeSessionSpec, "max_lifetime_seconds"),
    ],
)
def test_request_bounds_are_the_resources(
    request_model: type[BaseModel],
    request_field: str,
    spec_model: type[BaseModel],
    spec_field: str,
) -> None:
    assert bounds_of(request_model, request_field) == bounds_of(spec_model, spec_field)


def test_session_defaults_described_are_the_resources() -> None:
    fields = CreateSessionRequest.model_fields
    assert f"default {DEFAULT_IDLE_TIMEOUT_SECONDS} s" in str(
        fields["idle_timeout_seconds"].description
    )
    assert f"default {DEFAULT_MAX_LIFETIME_SECONDS} s" in str(
        fields["max_lifetime_seconds"].description
    )


# --- manifests --------------------------------------------------------------------------


def test_the_manifest_is_a_valid_code_execution() -> None:
    built = manifest(
        request(files=[{"path": "a/b.txt", "content": "x"}], stdin="in", cpu="1"), cpu="1"
    )

    assert built["apiVersion"] == API_VERSION
    assert built["kind"] == KIND
    assert built["metadata"]["labels"][TENANT_LABEL] == "team-a"
    spec = CodeExecutionSpec.model_validate(built["spec"])
    assert spec.source == "print(1)"
    assert spec.files[0].path == "a/b.txt"
    assert spec.stdin == "in"
    assert (spec.resources.memory, spec.resources.cpu) == ("256Mi", "1")
    assert spec.timeout_seconds == 10
    assert spec.ttl_seconds_after_finished == 600


def test_the_manifest_records_the_request_fingerprint() -> None:
    built = manifest(request())

    assert built["metadata"]["annotations"][REQUEST_HASH_ANNOTATION] == request_fingerprint(
        request()
    )
    assert request_fingerprint(request()) != request_fingerprint(request(code="print(2)"))


def test_what_the_resource_model_refuses_is_a_422_on_the_request_field() -> None:
    with pytest.raises(GatewayError) as refused:
        manifest(request(), timeout_seconds=10_000)

    assert refused.value.status_code == 422
    assert refused.value.details[0].field == "body.timeout_seconds"


def test_names_are_deterministic_per_tenant_and_key_and_valid() -> None:
    assert execution_name("a", "key") == execution_name("a", "key")
    assert execution_name("a", "key") != execution_name("b", "key")
    assert execution_name("a", None) != execution_name("a", None)
    for name in (execution_name("a", "k" * 255), execution_name("a", None)):
        assert execution_name_problem(name) is None


# --- results ----------------------------------------------------------------------------


def resource(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "cx-1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"language": "python", "mode": "run", "timeoutSeconds": 10, **spec},
        **({"status": status} if status is not None else {}),
    }


@pytest.mark.parametrize(
    ("status", "expected", "message"),
    [
        (None, ExecutionStatus.pending, None),
        ({"phase": "Running"}, ExecutionStatus.running, None),
        ({"phase": "Succeeded", "exitCode": 0}, ExecutionStatus.success, None),
        (
            {"phase": "Failed", "exitCode": 3},
            ExecutionStatus.error,
            "The program exited with code 3",
        ),
        (
            {"phase": "Failed", "reason": "OOMKilled", "exitCode": 137},
            ExecutionStatus.error,
            "The program ran out of memory and was killed",
        ),
        (
            {"phase": "Failed", "signal": 9},
            ExecutionStatus.error,
            "The program was killed by signal 9",
        ),
        (
            {"phase": "TimedOut"},
            ExecutionStatus.timeout,
            "The program exceeded its time limit of 10 s and was killed",
        ),
        ({"phase": "Cancelled"}, ExecutionStatus.cancelled, "The execution was cancelled"),
        (
            {"phase": "Error", "reason": "ImageNotFound", "message": "no image x"},
            ExecutionStatus.sandbox_error,
            "ImageNotFound: no image x",
        ),
    ],
)
def test_phases_map_to_agent_statuses(
    status: dict[str, Any] | None, expected: ExecutionStatus, message: str | None
) -> None:
    result = execution_result(resource(status))

    assert result.status == expected
    assert result.error_message == message


def test_the_result_carries_the_status_fields() -> None:
    result = execution_result(
        resource(
            {
                "phase": "Succeeded",
                "exitCode": 0,
                "stdout": "out",
                "stderr": "err",
                "stdoutTruncated": True,
                "durationMs": 41,
                "retryable": False,
                "startedAt": "2026-01-01T00:00:01Z",
                "finishedAt": "2026-01-01T00:00:02Z",
                "diagnostics": [{"code": "F401", "message": "unused", "line": 1, "column": 8}],
            },
            mode="lint",
        )
    )

    assert (result.id, result.language, result.mode) == ("cx-1", "python", "lint")
    assert (result.stdout, result.stderr, result.exit_code) == ("out", "err", 0)
    assert (result.stdout_truncated, result.stderr_truncated) == (True, False)
    assert result.execution_time_ms == 41
    assert result.retryable is False
    assert result.started_at == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert result.created_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert result.diagnostics is not None
    assert result.diagnostics[0].code == "F401"
    assert result.diagnostics[0].location.model_dump() == {"line": 1, "column": 8}


def test_an_odd_status_still_maps_without_failing() -> None:
    result = execution_result(
        resource(
            {
                "phase": "Succeeded",
                "exitCode": "zero",
                "stdout": 5,
                "startedAt": "yesterday",
                "diagnostics": [{"nope": 1}, "x", {"message": "kept"}],
                "signal": True,
            }
        )
    )

    assert result.status == ExecutionStatus.success
    assert (result.exit_code, result.stdout, result.started_at, result.signal) == (
        None,
        "",
        None,
        None,
    )
    assert [d.message for d in result.diagnostics or []] == ["kept"]


# --- Retry-After ------------------------------------------------------------------------


def test_retry_after_is_the_time_until_the_oldest_unfinished_execution_must_end() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def created(seconds_ago: float) -> dict[str, Any]:
        return {
            "metadata": {"creationTimestamp": (now - timedelta(seconds=seconds_ago)).isoformat()}
        }

    unfinished = [created(3), created(8), {"metadata": {}}]
    assert retry_after_seconds(unfinished, now, max_timeout_seconds=10, default=5) == 2
    assert retry_after_seconds(unfinished[2:], now, max_timeout_seconds=10, default=5) == 5
    assert retry_after_seconds([created(30)], now, max_timeout_seconds=10, default=5) == 1
    assert retry_after_seconds([created(0)], now, max_timeout_seconds=300, default=5) == 60


def test_the_status_is_read_through_its_model() -> None:
    status = read_status(
        resource({"phase": "Failed", "exitCode": 3, "conditions": [{"type": "x"}], "new": 1}),
        CodeExecutionStatus,
    )

    assert status is not None
    assert (status.phase, status.exit_code, status.conditions) == ("Failed", 3, [])
    assert read_status(resource({"phase": "Sleeping", "exitCode": 3}), CodeExecutionStatus) is None
    assert read_status(resource(None), CodeExecutionStatus) is None


# --- the run_code tool ---------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOLS, ids=lambda tool: tool.name)
async def test_mcp_and_openai_tools_derive_from_one_definition(tool: ToolDefinition) -> None:
    catalog = load_language_catalog(DEFAULT_CATALOG_PATH)
    mcp_tools = {t.name: t for t in await build_mcp_server(catalog).list_tools()}
    mcp_tool = mcp_tools[tool.name]
    mcp_properties = mcp_tool.input_schema["properties"]

    parameters = tool_parameters(tool, catalog, TenantLimits())
    properties = parameters["properties"]
    assert parameters["required"] == mcp_tool.input_schema["required"]
    assert set(properties) == set(mcp_properties)
    for name in mcp_tool.input_schema["required"]:
        assert {**properties[name], "title": mcp_properties[name]["title"]} == (
            mcp_properties[name]
        )
    assert mcp_tool.description == tool.description


def test_openai_maximums_are_the_tenants() -> None:
    catalog = load_language_catalog(DEFAULT_CATALOG_PATH)
    for tenant_maximum, advertised in ((60, 60), (MAX_TIMEOUT_SECONDS + 1, MAX_TIMEOUT_SECONDS)):
        limits = TenantLimits.model_construct(max_timeout_seconds=tenant_maximum)
        for tool in (RUN_CODE, RUN_IN_SESSION):
            timeout = tool_parameters(tool, catalog, limits)["properties"]["timeout_seconds"]
            assert timeout["maximum"] == advertised
    idle = tool_parameters(OPEN_SESSION, catalog, TenantLimits(max_idle_timeout_seconds=120))
    assert idle["properties"]["idle_timeout_seconds"]["maximum"] == 120


# --- runner frames ----------------------------------------------------------------------


def test_frames_decode_to_chunks_and_skip_everything_else() -> None:
    assert decode_frame(b'{"stream": "stdout", "data": "hi\\n"}') == OutputChunk("stdout", "hi\n")
    assert decode_frame(b'{"stream": "stderr", "data": ""}') == OutputChunk("stderr", "")
    for line in (b'{"result": {"exitCode": 0}}', b"not json", b"[1]", b'{"stream": "x"}'):
        assert decode_frame(line) is None


def test_the_decoder_reassembles_lines_split_anywhere() -> None:
    log = (
        b'{"stream": "stdout", "data": "a\\u00e9"}\n'
        b'{"stream": "stderr", "data": "b"}\n'
        b'{"result": {"exitCode": 0}}'
    )
    decoder = FrameDecoder()

    chunks = [chunk for i in range(len(log)) for chunk in decoder.feed(log[i : i + 1])]

    assert chunks == [OutputChunk("stdout", "a\u00e9"), OutputChunk("stderr", "b")]
    assert decoder.finish() == []


def test_the_decoder_keeps_a_last_line_without_newline() -> None:
    decoder = FrameDecoder()

    assert decoder.feed(b'{"stream": "stdout", "data": "x"}') == []
    assert decoder.finish() == [OutputChunk("stdout", "x")]


def test_the_decoder_drops_an_overlong_line_and_recovers() -> None:
    decoder = FrameDecoder()

    assert decoder.feed(b"x" * (MAX_FRAME_BYTES + 1)) == []
    assert decoder.feed(b'tail"}\n{"stream": "stdout", "data": "ok"}\n') == [
        OutputChunk("stdout", "ok")
    ]


def frame_line(data: str) -> bytes:
    return json.dumps({"seq": 1, "stream": "stdout", "data": data, "mac": "00"}).encode() + b"\n"


def summary_line() -> bytes:
    record = {"result": runner_wire.result(), "frames": 1, "key": "0" * 64}
    return json.dumps(record).encode() + b"\n"


def test_in_a_pod_of_many_runs_the_decoder_keeps_only_its_runs_frames() -> None:
    log = b"".join(
        [
            b'{"run": {"executionId": "before"}}\n',
            frame_line("earlier run\n"),
            summary_line(),
            b'{"run": {"executionId": "mine"}}\n',
            frame_line("mine\n"),
            summary_line(),
            b'{"run": {"executionId": "after"}}\n',
            frame_line("later run\n"),
        ]
    )
    decoder = FrameDecoder("mine")

    assert decoder.feed(log) == [OutputChunk("stdout", "mine\n")]
    assert decoder.ended


def test_a_warm_run_is_followed_from_just_before_it_started_and_by_its_id() -> None:
    started = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)
    execution = {
        "metadata": {"uid": "u-1"},
        "status": {"podName": "py-0", "startMode": "warm", "startedAt": started.isoformat()},
    }
    follow = log_follow(execution, started + timedelta(seconds=2.5))
    assert follow == LogFollow("py-0", "u-1", 3 + LOG_SINCE_SLACK_SECONDS)
    cold = {"metadata": {"uid": "u-2"}, "status": {"podName": "hello-abc", "startMode": "cold"}}
    assert log_follow(cold, started) == LogFollow("hello-abc")
    assert log_follow({"metadata": {"uid": "u-3"}, "status": {}}, started) is None


# --- API keys ---------------------------------------------------------------------------

TENANTS_YAML = f"""
tenants:
  team-a:
    namespace: sandbox-a
    limits: {{maxTimeoutSeconds: 30, maxMemory: 1Gi, maxCpu: "2", maxConcurrent: 3}}
    apiKeys:
      - {{name: ci, sha256: "{hash_api_key("sk-a1")}"}}
      - {{name: laptop, sha256: "{hash_api_key("sk-a2").upper()}"}}
  team-b:
    apiKeys:
      - sha256: {hash_api_key("sk-b")}
"""


def test_keys_resolve_to_their_tenant() -> None:
    index = KeyIndex(parse_tenants_config(TENANTS_YAML))

    team_a = index.resolve("sk-a1")
    assert team_a is not None
    assert (team_a.name, team_a.namespace) == ("team-a", "sandbox-a")
    assert team_a.limits.max_timeout_seconds == 30
    assert team_a.limits.max_concurrent == 3
    assert index.resolve("sk-a2") == team_a
    team_b = index.resolve("sk-b")
    assert team_b is not None
    assert (team_b.namespace, team_b.limits.max_concurrent) == ("team-b", 5)
    assert index.resolve("sk-a") is None
    assert index.resolve("") is None


@pytest.mark.parametrize(
    "text",
    [
        "tenants: [",
        "tenants: {Team_A: {}}",
        "tenants: {a: {apiKeys: [{sha256: short}]}}",
        "tenants: {a: {limits: {maxMemory: lots}}}",
        "tenants: {a: {surprise: 1}}",
    ],
)
def test_a_broken_tenants_file_is_refused_with_a_message(text: str) -> None:
    with pytest.raises(ValueError, match=r"tenants\.yaml"):
        parse_tenants_config(text)


def test_locations_read_like_paths() -> None:
    assert format_location(("body", "files", 0, "path")) == "body.files[0].path"
    assert format_location(()) == ""

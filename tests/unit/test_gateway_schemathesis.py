"""Property-based tests of the gateway against its own OpenAPI document (schemathesis):
whatever the input, no 5xx and every answer matches the documented schema."""

import tempfile
from pathlib import Path

import schemathesis
from gateway_fakes import FakeExecutionService, make_app, tenant
from hypothesis import HealthCheck, settings
from schemathesis.checks import (  # the checks registry (module __getattr__)
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

KEY = "sk-fuzz-0123456789"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


# Loading the schema runs the app's lifespan, which needs a kubeconfig (never contacted).
_kubeconfig_dir = tempfile.TemporaryDirectory()
schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    make_app(FakeExecutionService(), {KEY: tenant("fuzz")}, Path(_kubeconfig_dir.name)),
)


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_gateway_keeps_to_its_openapi_document(case: schemathesis.Case) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, checks=CHECKS)


@schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_without_a_key_every_operation_answers_as_documented(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=CHECKS)

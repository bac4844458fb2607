"""Bad input, by hand, beyond what schemathesis generates: to the gateway (the real process
against the cluster) and to the API server (`kubectl apply` / `kubectl create`).

Every request is refused with a clear 4xx (or kubectl error) whose message names the field,
never a 500; nothing is created; the gateway stays healthy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from chart_release import DeployedGateway
from executions import kubectl, manifest
from kubernetes import client
from results_table import Row
from sandpod_testkit.kube import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.usefixtures("sandpod_operator")

VALID = {"language": "python", "code": "print(1)"}
DEEP = 100_000


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@dataclass(frozen=True)
class BadRequest:
    id: str
    # JSON-able body, or raw bytes sent as they are.
    body: Any
    names: str  # what the error must mention (a field, a header, the body)
    statuses: tuple[int, ...] = (422,)
    headers: dict[str, str | bytes] = field(default_factory=dict)


GATEWAY_CASES = (
    BadRequest("body-over-1mib", {**VALID, "code": "x" * (5 << 20)}, "request body", (413,)),
    BadRequest(
        "body-over-1mib-chunked", iter([b'{"code": "' + b"x" * (2 << 20) + b'"}']),
        "request body", (413,),
    ),
    BadRequest("code-over-256kib", {**VALID, "code": "x" * (300 << 10)}, "code", (413,)),
    BadRequest("deep-json-body", nested(DEEP).encode(), "body", (400, 422)),
    BadRequest("deep-json-in-field", f'{{"language": "python", "code": {nested(DEEP)}}}'.encode(),
               "body", (400, 422)),
    BadRequest("not-json", b'{"language": python', "body"),
    BadRequest("empty-body", b"", "body"),
    BadRequest("body-is-a-list", [VALID], "body"),
    BadRequest("body-is-null", None, "body"),
    BadRequest("language-is-a-number", {**VALID, "language": 123}, "language"),
    BadRequest("code-is-a-list", {**VALID, "code": ["print(1)"]}, "code"),
    BadRequest("code-is-null", {**VALID, "code": None}, "code"),
    BadRequest("timeout-is-text", {**VALID, "timeout_seconds": "ten"}, "timeout_seconds"),
    BadRequest("timeout-is-nan", b'{"language": "python", "code": "1", "timeout_seconds": NaN}',
               "timeout_seconds"),
    BadRequest("args-is-a-string", {**VALID, "args": "a b"}, "args"),
    BadRequest("args-ten-thousand", {**VALID, "args": ["a"] * 10_000}, "args", (413, 422)),
    BadRequest("unknown-field", {**VALID, "privileged": True}, "privileged"),
    BadRequest("unicode-language", {**VALID, "language": "pythön"}, "language", (400, 422)),
    BadRequest("language-path", {**VALID, "language": "../../etc/passwd"}, "language",
               (400, 422)),
    BadRequest("unicode-file-path", {**VALID, "files": [{"path": "dätä/ïn.txt", "content": "x"}]},
               "files"),
    BadRequest("file-path-escapes", {**VALID, "files": [{"path": "../escape", "content": "x"}]},
               "files"),
    BadRequest("absolute-file-path", {**VALID, "files": [{"path": "/etc/passwd", "content": ""}]},
               "files"),
    BadRequest("lone-surrogate", b'{"language": "python", "code": "\\ud800"}', "code"),
    BadRequest("unicode-idempotency-key", VALID, "Idempotency-Key", (400, 422),
               headers={"Idempotency-Key": "schnee-☃".encode()}),
    BadRequest("idempotency-key-too-long", VALID, "Idempotency-Key", (400, 422),
               headers={"Idempotency-Key": "k" * 300}),
    BadRequest("negative-timeout", {**VALID, "timeout_seconds": -1}, "timeout_seconds"),
    BadRequest("zero-timeout", {**VALID, "timeout_seconds": 0}, "timeout_seconds"),
    BadRequest("enormous-timeout", {**VALID, "timeout_seconds": 10**30}, "timeout_seconds",
               (400, 403, 422)),
    BadRequest("fractional-timeout", {**VALID, "timeout_seconds": 1.5}, "timeout_seconds"),
    BadRequest("negative-memory", {**VALID, "memory": "-1Gi"}, "memory"),
    BadRequest("enormous-memory", {**VALID, "memory": "99999999Ei"}, "memory", (400, 403, 422)),
    BadRequest("memory-is-prose", {**VALID, "memory": "lots"}, "memory"),
    BadRequest("negative-cpu", {**VALID, "cpu": "-1"}, "cpu"),
    BadRequest("enormous-cpu", {**VALID, "cpu": "1e308"}, "cpu", (400, 403, 422)),
    BadRequest("negative-output-cap", {**VALID, "max_output_bytes": -5}, "max_output_bytes"),
    BadRequest("enormous-output-cap", {**VALID, "max_output_bytes": 10**20}, "max_output_bytes"),
    BadRequest("text-plain", json.dumps(VALID).encode(), "body", (415, 422),
               headers={"Content-Type": "text/plain"}),
)  # fmt: skip


@pytest.fixture(scope="module")
def tenant_key(
    gateway: DeployedGateway, core_v1: client.CoreV1Api, hostile_prefix: str
) -> Iterator[str]:
    """A tenant (and its namespace) for the whole module; the namespace must stay empty."""
    namespace = f"{hostile_prefix}-bad-input"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        yield gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=60, maxMemory="1Gi")
    finally:
        core_v1.delete_namespace(namespace, propagation_policy="Background")


def error_text(response: httpx.Response) -> str:
    """The error's details (field: message), code and message, as one string to search."""
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"(not a JSON error: {response.text[:200]!r})"
    details = "; ".join(
        f"{d['field']}: {d['message']}" if d.get("field") else d["message"]
        for d in error["details"]
    )
    return f"{details} ({error['code']}: {error['message']})" if details else error["message"]


@pytest.mark.parametrize("bad", GATEWAY_CASES, ids=[bad.id for bad in GATEWAY_CASES])
def test_gateway_refuses(
    bad: BadRequest,
    gateway: DeployedGateway,
    tenant_key: str,
    custom_objects: client.CustomObjectsApi,
    hostile_prefix: str,
    table_row: Row,
) -> None:
    table_row.expected = f"{'/'.join(map(str, bad.statuses))} naming {bad.names}"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {tenant_key}"}
    headers.update(bad.headers)
    raw = isinstance(bad.body, bytes | Iterator)
    content = bad.body if raw else json.dumps(bad.body).encode()
    with httpx.Client(timeout=60) as http:
        response = http.post(
            f"{gateway.url}/v1/executions",
            content=content,
            headers=headers,
            params={"wait": "false"},
        )
    text = error_text(response)
    table_row.observed = f"{response.status_code} {text[:60]}"
    assert response.status_code in bad.statuses, (response.status_code, text)
    assert bad.names.lower() in text.lower(), text
    listed = custom_objects.list_namespaced_custom_object(
        GROUP, VERSION, f"{hostile_prefix}-bad-input", PLURAL
    )
    assert listed["items"] == [], "a refused request created an execution"
    assert httpx.get(f"{gateway.url}/healthz", timeout=10).status_code == 200


# --- the API server, through kubectl -------------------------------------------------------------


@dataclass(frozen=True)
class BadObject:
    id: str
    change: dict[str, Any]  # merged into a valid spec (None removes a key)
    names: str  # what kubectl's error must mention
    name: str = "bad"
    verb: str = "apply"


KUBECTL_CASES = (
    BadObject("unicode-name", {}, "metadata.name", name="pythön-ü"),
    BadObject("name-too-long", {}, "metadata.name", name="n" * 64),
    BadObject("name-with-dots", {}, "metadata.name", name="a.b.c"),
    BadObject("negative-timeout", {"timeoutSeconds": -1}, "spec.timeoutSeconds"),
    BadObject("enormous-timeout", {"timeoutSeconds": 10**15}, "spec.timeoutSeconds"),
    BadObject("timeout-is-text", {"timeoutSeconds": "ten"}, "spec.timeoutSeconds"),
    BadObject("source-is-a-number", {"source": 123}, "spec.source"),
    BadObject("source-missing", {"source": None}, "spec.source"),
    BadObject("args-is-a-string", {"args": "a b"}, "spec.args"),
    BadObject("too-many-args", {"args": ["a"] * 65}, "spec.args"),
    BadObject("negative-output-cap", {"maxOutputBytes": -1}, "spec.maxOutputBytes"),
    BadObject("enormous-output-cap", {"maxOutputBytes": 10**18}, "spec.maxOutputBytes"),
    BadObject("negative-memory", {"resources": {"memory": "-1Gi"}}, "spec.resources.memory"),
    BadObject("enormous-memory", {"resources": {"memory": "99999Ei"}}, "spec.resources.memory"),
    BadObject("negative-cpu", {"resources": {"cpu": "-500m"}}, "spec.resources.cpu"),
    BadObject("unknown-field", {"privileged": True}, "privileged"),
    BadObject("unicode-language", {"language": "pythön"}, "spec.language"),
    BadObject("absolute-file-path", {"files": [{"path": "/etc/passwd", "content": ""}]},
              "spec.files[0].path"),
    BadObject("deep-files", {"files": json.loads(nested(500))}, "spec.files"),
    BadObject("bad-cidr", {"network": {"egress": "allowlist", "allow": [{"cidr": "999.1.1.1/8"}]}},
              "cidr"),
    BadObject("source-over-256k", {"source": "x" * (600 << 10)}, "spec.source", verb="create"),
    BadObject("body-over-3mib", {"source": "x" * (4 << 20)}, "too large", verb="create"),
)  # fmt: skip


def bad_manifest(bad: BadObject) -> dict[str, Any]:
    spec: dict[str, Any] = {"language": "python", "source": "print(1)"}
    for key, value in bad.change.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return manifest(bad.name, spec)


@pytest.mark.parametrize("bad", KUBECTL_CASES, ids=[bad.id for bad in KUBECTL_CASES])
def test_kubectl_refuses(
    bad: BadObject,
    hostile_namespace: str,
    kubeconfig_path: Path,
    custom_objects: client.CustomObjectsApi,
    table_row: Row,
) -> None:
    table_row.expected = f"refused naming {bad.names}"
    document = json.dumps(bad_manifest(bad))
    result = kubectl(kubeconfig_path, bad.verb, "-n", hostile_namespace, "-f", "-", stdin=document)
    lines = result.stderr.strip().splitlines() or ["(no error)"]
    telling = next((line for line in lines if bad.names in line), lines[-1])
    table_row.observed = f"exit {result.returncode}: {telling.strip()[:70]}"
    assert result.returncode != 0, result.stdout
    assert bad.names in result.stderr, result.stderr[-2000:]
    listed = custom_objects.list_namespaced_custom_object(GROUP, VERSION, hostile_namespace, PLURAL)
    assert listed["items"] == [], "a refused object was created"


# What YAML parsers (go-yaml, in kubectl and in the API server) say when a document's aliases
# would expand past their limit: the refusal is the parser's, before any schema sees the object.
ALIAS_LIMIT = "yaml: document contains excessive aliasing"


def yaml_bomb() -> str:
    """A CodeExecution with a billion-laughs alias bomb (9^9 leaves) under spec.bomb."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, 9):
        previous, this = chr(ord("a") + level - 1), chr(ord("a") + level)
        lines.append(f"{this}: &{this} [{','.join(['*' + previous] * 9)}]")
    document = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CodeExecution",
        "metadata": {"name": "bomb"},
    }
    text = yaml.safe_dump(document) + "spec:\n  language: python\n  source: print(1)\n"
    return text + "  bomb:\n" + "\n".join(f"    {line}" for line in lines) + "\n"


def test_kubectl_yaml_bomb_is_refused(
    hostile_namespace: str,
    kubeconfig_path: Path,
    custom_objects: client.CustomObjectsApi,
    table_row: Row,
) -> None:
    """kubectl's own parser refuses the alias bomb: it never expands, never reaches the API."""
    table_row.expected = f"kubectl's YAML parser refuses: {ALIAS_LIMIT}"
    result = kubectl(
        kubeconfig_path, "apply", "-n", hostile_namespace, "-f", "-", stdin=yaml_bomb()
    )
    said = ALIAS_LIMIT if ALIAS_LIMIT in result.stderr else result.stderr.strip()[-70:]
    table_row.observed = f"exit {result.returncode}: {said}"
    assert result.returncode != 0, result.stdout
    assert ALIAS_LIMIT in result.stderr, result.stderr[-2000:]
    listed = custom_objects.list_namespaced_custom_object(GROUP, VERSION, hostile_namespace, PLURAL)
    assert listed["items"] == [], "the bomb was created"


def test_api_server_yaml_bomb_is_refused(
    hostile_namespace: str,
    api_client: client.ApiClient,
    custom_objects: client.CustomObjectsApi,
    table_row: Row,
) -> None:
    """The same bomb sent as YAML straight to the API server (no kubectl to parse it first):
    refused 400 by the server's YAML parser."""
    table_row.expected = f"400 from the API server's YAML parser: {ALIAS_LIMIT}"
    request = api_client.param_serialize(
        "POST",
        f"/apis/{GROUP}/{VERSION}/namespaces/{hostile_namespace}/{PLURAL}",
        header_params={"Content-Type": "application/yaml", "Accept": "application/json"},
        body=yaml_bomb(),
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*request)
    body = response.read().decode(errors="replace")
    table_row.observed = f"{response.status}: {ALIAS_LIMIT if ALIAS_LIMIT in body else body[:70]}"
    assert response.status == 400, body
    assert ALIAS_LIMIT in body, body
    listed = custom_objects.list_namespaced_custom_object(GROUP, VERSION, hostile_namespace, PLURAL)
    assert listed["items"] == [], "the bomb was created"

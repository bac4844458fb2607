"""A tenant's bounds held across the chart's two gateway replicas (the operator counts for
both: sandpod_operator/admission), and for kubectl users: maxConcurrent and maxSessions under
creates from many clients at once through both replicas, maxStoredBytes refused naming the
limit, a kubectl create over its namespace's stored bytes ended without running, and a create
refused 503 while the operator cannot be asked."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from chart_release import ChartRelease, DeployedGateway, bearer, installed, new_api_key
from cluster_fixtures import ReleaseFactory
from kubernetes import client
from sandpod_contract.models import TERMINAL_PHASES
from sandpod_testkit.kube import GROUP, PLURAL, VERSION
from sandpod_testkit.waiting import wait_until

CLIENTS = 12
# Runs long enough to stay unfinished while every create of a test is decided.
SLEEPER = {"language": "python", "code": "import time; time.sleep(60)", "timeout_seconds": 90}
STORED_BOUND = 100_000
KUBECTL_BOUND = 50_000
FILLER = 40_000  # bytes of source per execution in the stored-bytes tests


@dataclass(frozen=True)
class Bounds:
    """The release, and each tenant's key and namespace."""

    release: ChartRelease
    keys: dict[str, str]
    namespaces: dict[str, str]


@pytest.fixture(scope="module")
def bounds(new_release: ReleaseFactory, namespace_prefix: str) -> Iterator[Bounds]:
    prefix = f"{namespace_prefix}tb"
    suffix = uuid.uuid4().hex[:4]
    tenants = [
        ("busy", {"maxConcurrent": 3, "maxTimeoutSeconds": 120}),
        ("sessions", {"maxSessions": 2}),
        ("keeper", {"maxStoredBytes": STORED_BOUND}),
        ("kubectl", {"maxStoredBytes": KUBECTL_BOUND}),
        ("cut-off", {}),
    ]
    keys: dict[str, str] = {}
    namespaces = {name: f"{prefix}-{name}-{suffix}" for name, _ in tenants}
    values: list[dict[str, Any]] = []
    for name, limits in tenants:
        key, digest = new_api_key()
        keys[name] = key
        values.append(
            {
                "name": name,
                "namespace": namespaces[name],
                "limits": limits,
                "apiKeys": [{"sha256": digest}],
            }
        )
    release = new_release(prefix, {"tenants": values, "gateway": {"replicas": 2}})
    with installed(release):
        release.gateway().wait_ready()
        yield Bounds(release, keys, namespaces)


def posted_through_both(
    gateway: DeployedGateway, key: str, path: str, bodies: list[dict[str, Any]]
) -> list[httpx.Response]:
    """Each body POSTed at once by its own client, alternately to each gateway pod."""
    urls = gateway.pod_urls()
    assert len(urls) == 2

    def post(index: int) -> httpx.Response:
        with httpx.Client(base_url=urls[index % 2], headers=bearer(key), timeout=60) as http:
            return http.post(path, json=bodies[index])

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(post, range(len(bodies))))


def codes(responses: list[httpx.Response]) -> list[tuple[int, str | None]]:
    return sorted(
        (r.status_code, r.json()["error"]["code"] if r.status_code >= 400 else None)
        for r in responses
    )


def test_creates_from_many_clients_through_both_replicas_keep_max_concurrent(
    bounds: Bounds,
) -> None:
    gateway = bounds.release.gateway()
    key = bounds.keys["busy"]

    answers = posted_through_both(gateway, key, "/v1/executions?wait=false", [SLEEPER] * CLIENTS)

    assert codes(answers) == [(202, None)] * 3 + [(429, "concurrency_limit")] * (CLIENTS - 3)
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.json()["error"]["details"][0]["limit"] == 3
    assert int(refused.headers["Retry-After"]) >= 1
    with gateway.client(key) as http:
        usage = http.get("/v1/tenant").json()["usage"]
        assert usage["running"] == 3
        for answer in answers:
            if answer.status_code == 202:
                http.delete(f"/v1/executions/{answer.json()['id']}")


def test_sessions_from_many_clients_through_both_replicas_keep_max_sessions(
    bounds: Bounds,
) -> None:
    gateway = bounds.release.gateway()
    key = bounds.keys["sessions"]

    answers = posted_through_both(gateway, key, "/v1/sessions", [{"language": "python"}] * 8)

    assert codes(answers) == [(201, None)] * 2 + [(429, "session_limit")] * 6
    with gateway.client(key) as http:
        assert http.get("/v1/tenant").json()["usage"]["sessions"] == 2
        for answer in answers:
            if answer.status_code == 201:
                http.delete(f"/v1/sessions/{answer.json()['id']}")


def filler(label: str) -> dict[str, Any]:
    """A create whose spec keeps about FILLER bytes."""
    return {"language": "python", "code": f"# {label}\n" + "#" * FILLER + "\nprint(1)"}


def test_a_create_over_the_stored_bytes_is_refused_naming_the_limit(
    bounds: Bounds,
) -> None:
    gateway = bounds.release.gateway()
    with gateway.client(bounds.keys["keeper"]) as http:
        for label in ("first", "second"):
            kept = http.post("/v1/executions", params={"wait": "false"}, json=filler(label))
            assert kept.status_code == 202, kept.text

        refused = http.post("/v1/executions", params={"wait": "false"}, json=filler("third"))
        tenant = http.get("/v1/tenant").json()

    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "stored_bytes_limit"
    assert "maxStoredBytes" in error["message"]
    assert (error["details"][0]["type"], error["details"][0]["limit"]) == (
        "max_stored_bytes",
        STORED_BOUND,
    )
    assert tenant["limits"]["max_stored_bytes"] == STORED_BOUND
    assert 2 * FILLER < tenant["usage"]["stored_bytes"] <= STORED_BOUND


def terminal(objects: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    found: Any = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    status = found.get("status") or {}
    return dict(status) if status.get("phase") in TERMINAL_PHASES else None


def test_a_kubectl_create_over_the_stored_bytes_ends_failed_naming_the_bound(
    bounds: Bounds, custom_objects: client.CustomObjectsApi
) -> None:
    namespace = bounds.namespaces["kubectl"]

    def create(name: str) -> None:
        source = "#" * 30_000 + "\nprint('ran')"
        custom_objects.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "CodeExecution",
                "metadata": {"name": name},
                # Generous: the node's two cores are shared.
                "spec": {"language": "python", "source": source, "timeoutSeconds": 120},
            },
        )

    create("within")
    first = wait_until(
        lambda: terminal(custom_objects, namespace, "within"), timeout=180, what="within to end"
    )
    create("over")
    second = wait_until(
        lambda: terminal(custom_objects, namespace, "over"), timeout=60, what="over to end"
    )

    assert (first["phase"], first.get("stdout")) == ("Succeeded", "ran\n")
    assert (second["phase"], second["reason"]) == ("Failed", "StoredBytesLimit")
    assert f"maxStoredBytes={KUBECTL_BOUND}" in second["message"]
    assert not second.get("podName") and second.get("stdout") is None


def test_a_create_while_the_operator_cannot_be_asked_is_refused_503(
    bounds: Bounds,
) -> None:
    operator = bounds.release.component("operator")
    gateway = bounds.release.gateway()
    operator.stop()
    try:
        with gateway.client(bounds.keys["cut-off"]) as http:
            refused = http.post(
                "/v1/executions",
                params={"wait": "false"},
                json={"language": "python", "code": "print(1)"},
            )
            session = http.post("/v1/sessions", json={"language": "python"})
            listed = http.get("/v1/executions").json()
    finally:
        operator.start()

    for answer in (refused, session):
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "admission_unavailable"
        assert int(answer.headers["Retry-After"]) >= 1
    assert listed["items"] == []

"""Bounds per tenant in the gateway: its request rate (a token bucket per tenant, each replica
taking its share; 429 rate_limited with Retry-After beyond it), and the ResourceQuota refusals
of the API server mapped to answers that say what happened: a quota used up is 429
quota_exceeded naming it, a quota not counted yet (just after an install) is 503 with
Retry-After: 1, never a 500."""

from typing import Any

import pytest
from fake_clock import FakeClock
from fastapi.testclient import TestClient
from gateway_fakes import (
    FakeExecutionService,
    FakeSessionService,
    make_app,
    refusing_services,
    tenant,
)
from kubernetes_asyncio.client import ApiClient
from sandpod_gateway.kube.service import KubernetesUnavailable, QuotaExceeded, QuotaNotCounted
from sandpod_gateway.policy.admission import AdmissionControl, RateShare, TokenBucket
from sandpod_gateway.policy.auth import Tenant, TenantLimits
from sandpod_gateway.web.errors import GatewayError, as_gateway_error

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-0123456789"
RUN = {"language": "python", "code": "print(1)"}


# --- the token bucket -----------------------------------------------------------------------


def test_a_bucket_gives_its_burst_then_one_token_per_interval() -> None:
    bucket = TokenBucket(tokens=3, updated=0.0)

    assert [bucket.take(0.0, rate=2, burst=3) for _ in range(3)] == [0, 0, 0]
    assert bucket.take(0.0, rate=2, burst=3) == pytest.approx(0.5)
    assert bucket.take(0.25, rate=2, burst=3) == pytest.approx(0.25)
    assert bucket.take(0.5, rate=2, burst=3) == 0


def test_a_bucket_never_holds_more_than_its_burst() -> None:
    bucket = TokenBucket(tokens=0, updated=0.0)

    waits = [bucket.take(3600.0, rate=10, burst=4) for _ in range(5)]

    assert waits[:4] == [0, 0, 0, 0]
    assert waits[4] == pytest.approx(0.1)


def test_a_clock_going_back_adds_no_tokens() -> None:
    bucket = TokenBucket(tokens=0, updated=10.0)

    assert bucket.take(5.0, rate=1, burst=5) == pytest.approx(1.0)
    assert bucket.take(10.5, rate=1, burst=5) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("replicas", "rate", "burst"),
    [(1, 50.0, 100.0), (2, 25.0, 50.0), (3, 50 / 3, 100 / 3), (200, 0.25, 1.0)],
)
def test_each_replica_takes_its_share(replicas: int, rate: float, burst: float) -> None:
    share = RateShare.of(TenantLimits(), replicas)

    assert (share.rate, share.burst) == (pytest.approx(rate), pytest.approx(burst))


# --- admission: the tenant's bucket ------------------------------------------------------------


TENANTS = {
    ALICE: tenant("alice", requests_per_second=2, request_burst=4),
    BOB: tenant("bob", requests_per_second=2, request_burst=4),
}


def refusal(admission: AdmissionControl, who: Tenant, replicas: int = 1) -> GatewayError | None:
    """The error counting one request of `who` raises, or None once it is admitted."""
    try:
        admission.count_request(who, replicas)
    except GatewayError as error:
        return error
    return None


def admitted(admission: AdmissionControl, who: Tenant, requests: int) -> list[bool]:
    return [refusal(admission, who) is None for _ in range(requests)]


def test_beyond_the_burst_a_request_is_429_rate_limited_naming_the_limit() -> None:
    admission = AdmissionControl(FakeClock())

    assert admitted(admission, TENANTS[ALICE], 4) == [True] * 4
    error = refusal(admission, TENANTS[ALICE])

    assert error is not None
    assert (error.status_code, error.code) == (429, "rate_limited")
    assert "2 requests per second" in error.message
    assert "bursts of up to 4" in error.message
    assert [(d.type, d.limit) for d in error.details] == [("requests_per_second", 2)]
    assert error.headers == {"Retry-After": "1"}


def test_the_bucket_refills_at_the_tenants_rate_up_to_its_burst() -> None:
    clock = FakeClock()
    admission = AdmissionControl(clock)
    admitted(admission, TENANTS[ALICE], 4)

    clock.advance(0.5)  # one token, at 2 per second
    assert admitted(admission, TENANTS[ALICE], 2) == [True, False]
    clock.advance(60)
    assert admitted(admission, TENANTS[ALICE], 5) == [True] * 4 + [False]


def test_one_tenants_flood_leaves_another_tenant_its_own_bucket() -> None:
    admission = AdmissionControl(FakeClock())
    admitted(admission, TENANTS[ALICE], 50)

    assert admitted(admission, TENANTS[BOB], 4) == [True] * 4


def test_with_replicas_each_admits_its_share_and_says_when_to_retry() -> None:
    admission = AdmissionControl(FakeClock())
    slow = tenant("slow", requests_per_second=1, request_burst=4)

    assert refusal(admission, slow, replicas=4) is None  # a burst of 4 over 4 replicas: 1 here
    error = refusal(admission, slow, replicas=4)

    assert error is not None
    # A token every 4 s at this replica's share of 1 request per second: whole seconds, >= 1.
    assert error.headers == {"Retry-After": "4"}


def test_a_tenants_new_limits_apply_to_its_bucket() -> None:
    clock = FakeClock()
    admission = AdmissionControl(clock)
    admitted(admission, TENANTS[ALICE], 4)
    raised = tenant("alice", requests_per_second=2, request_burst=10)

    assert admitted(admission, raised, 1) == [False]  # no tokens appear at once
    clock.advance(60)
    assert admitted(admission, raised, 11) == [True] * 10 + [False]


# --- over HTTP ---------------------------------------------------------------------------------


def rate_limited_app(clock: FakeClock, **settings: Any) -> TestClient:
    app = make_app(FakeExecutionService(), dict(TENANTS), **settings)
    app.state.admission = AdmissionControl(clock)
    return TestClient(app)


def test_over_http_the_tenant_gets_429_with_retry_after_and_another_is_served() -> None:
    clock = FakeClock()
    http = rate_limited_app(clock)
    alice = {"Authorization": f"Bearer {ALICE}"}

    answers = [http.get("/v1/tenant", headers=alice) for _ in range(5)]

    assert [a.status_code for a in answers] == [200, 200, 200, 200, 429]
    error = answers[-1].json()["error"]
    assert error["code"] == "rate_limited"
    assert error["details"] == [
        {"message": "too many requests", "type": "requests_per_second", "limit": 2}
    ]
    assert answers[-1].headers["Retry-After"] == "1"
    assert http.get("/v1/tenant", headers={"Authorization": f"Bearer {BOB}"}).status_code == 200
    clock.advance(0.5)
    assert http.post("/v1/executions", headers=alice, json=RUN).status_code == 200


def test_every_kind_of_request_counts_and_an_unknown_key_is_still_401() -> None:
    http = rate_limited_app(FakeClock())
    alice = {"Authorization": f"Bearer {ALICE}"}
    http.post("/v1/executions?wait=false", headers=alice, json=RUN)
    http.get("/v1/executions", headers=alice)
    http.get("/v1/languages", headers=alice)
    http.get("/v1/sessions", headers=alice)

    assert http.get("/v1/tools/openai", headers=alice).status_code == 429
    assert http.get("/v1/tenant", headers={"Authorization": "Bearer sk-none"}).status_code == 401


def test_the_replica_count_setting_divides_the_tenants_rate() -> None:
    http = rate_limited_app(FakeClock(), replicas=2)
    alice = {"Authorization": f"Bearer {ALICE}"}

    answers = [http.get("/v1/tenant", headers=alice).status_code for _ in range(3)]

    assert answers == [200, 200, 429]


def test_the_tenant_endpoint_shows_both_limits() -> None:
    http = rate_limited_app(FakeClock())

    limits = http.get("/v1/tenant", headers={"Authorization": f"Bearer {ALICE}"}).json()["limits"]

    assert (limits["requests_per_second"], limits["request_burst"]) == (2, 4)


def test_the_defaults_are_50_per_second_and_a_burst_of_100() -> None:
    limits = TenantLimits()

    assert (limits.requests_per_second, limits.request_burst) == (50, 100)
    assert TenantLimits.model_validate({"requestsPerSecond": 7, "requestBurst": 9}) == (
        TenantLimits(requests_per_second=7, request_burst=9)
    )


def test_openapi_lists_429_wherever_it_lists_401() -> None:
    http = rate_limited_app(FakeClock())

    paths = http.get("/openapi.json").json()["paths"]

    operations = [
        (f"{method.upper()} {path}", set(operation["responses"]))
        for path, methods in paths.items()
        for method, operation in methods.items()
    ]
    assert [name for name, codes in operations if "401" in codes]
    assert [name for name, codes in operations if "401" in codes and "429" not in codes] == []


# --- ResourceQuota refusals --------------------------------------------------------------------

# The API server's answers, as kube-apiserver 1.34's quota admission words them.
EXCEEDED = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'codeexecutions.sandpod.dev "cx-1" is forbidden: exceeded quota: sandpod-objects, '
    "requested: count/codeexecutions.sandpod.dev=1, used: count/codeexecutions.sandpod.dev=2, "
    "limited: count/codeexecutions.sandpod.dev=2",
    "reason": "Forbidden",
    "details": {"name": "cx-1", "group": "sandpod.dev", "kind": "codeexecutions"},
    "code": 403,
}
NOT_COUNTED = {
    **EXCEEDED,
    "message": 'codeexecutions.sandpod.dev "hello" is forbidden: status unknown for quota: '
    "sandpod-objects, resources: count/codeexecutions.sandpod.dev",
}
RBAC_FORBIDDEN = {
    **EXCEEDED,
    "message": 'codeexecutions.sandpod.dev is forbidden: User "system:serviceaccount:x:y" '
    'cannot create resource "codeexecutions" in API group "sandpod.dev"',
}


async def refusal_of(status: dict[str, Any]) -> list[Exception]:
    """What the execution and the session services raise for a create refused with `status`."""
    raised: list[Exception] = []
    async with ApiClient() as api_client:
        executions, sessions = refusing_services(api_client, status)
        for service in (executions, sessions):
            try:
                await service.create("ns", {"metadata": {"name": "cx-1"}})
            except Exception as error:
                raised.append(error)
    return raised


async def test_a_quota_used_up_is_quota_exceeded_with_its_name_and_limit() -> None:
    for error in await refusal_of(EXCEEDED):
        assert isinstance(error, QuotaExceeded)
        assert (error.quota, error.limited) == (
            "sandpod-objects",
            "count/codeexecutions.sandpod.dev=2",
        )


async def test_a_quota_not_counted_yet_is_quota_not_counted() -> None:
    for error in await refusal_of(NOT_COUNTED):
        assert isinstance(error, QuotaNotCounted)
        assert error.quota == "sandpod-objects"


async def test_any_other_403_stays_the_cluster_being_unavailable() -> None:
    for error in await refusal_of(RBAC_FORBIDDEN):
        assert isinstance(error, KubernetesUnavailable)


def test_the_mapping_quota_not_counted_is_503_retry_after_1_and_exceeded_429() -> None:
    not_counted = as_gateway_error(QuotaNotCounted("sandpod-objects"), retry_after_seconds=5)
    exceeded = as_gateway_error(
        QuotaExceeded("sandpod-objects", "count/codeexecutions.sandpod.dev=2"), 5
    )

    assert not_counted is not None and exceeded is not None
    assert (not_counted.status_code, not_counted.code) == (503, "quota_not_counted")
    assert not_counted.headers == {"Retry-After": "1"}
    assert "sandpod-objects" in not_counted.message
    assert (exceeded.status_code, exceeded.code) == (429, "quota_exceeded")
    assert exceeded.headers == {"Retry-After": "5"}
    assert "sandpod-objects" in exceeded.message


class QuotaRefusals(FakeExecutionService):
    """Creates refused by `error` until it is set to None (the quota counted, or freed)."""

    def __init__(self, error: Exception | None) -> None:
        super().__init__()
        self.error = error

    async def create(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return await super().create(namespace, manifest)


class SessionQuotaRefusals(FakeSessionService):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def create(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        raise self.error


def test_a_create_right_after_install_is_503_then_succeeds_with_the_same_key() -> None:
    service = QuotaRefusals(QuotaNotCounted("sandpod-objects"))
    http = TestClient(make_app(service, {ALICE: tenant("alice")}))
    alice = {"Authorization": f"Bearer {ALICE}", "Idempotency-Key": "first"}

    refused = http.post("/v1/executions", headers=alice, json=RUN)
    service.error = None
    retried = http.post("/v1/executions", headers=alice, json=RUN)

    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "quota_not_counted"
    assert refused.headers["Retry-After"] == "1"
    assert retried.status_code == 200, retried.text
    assert len(service.created) == 1


def test_a_quota_used_up_is_429_quota_exceeded_for_executions_and_sessions() -> None:
    error = QuotaExceeded("sandpod-objects", "count/codesessions.sandpod.dev=100")
    app = make_app(
        QuotaRefusals(error), {ALICE: tenant("alice")}, sessions=SessionQuotaRefusals(error)
    )
    http = TestClient(app, headers={"Authorization": f"Bearer {ALICE}"})

    for answer in (
        http.post("/v1/executions", json=RUN),
        http.post("/v1/sessions", json={"language": "python"}),
    ):
        assert answer.status_code == 429, answer.text
        body = answer.json()["error"]
        assert body["code"] == "quota_exceeded"
        assert "sandpod-objects" in body["message"]
        assert body["details"][0]["limit"] == "count/codesessions.sandpod.dev=100"
        assert int(answer.headers["Retry-After"]) >= 1

"""Idempotency: a retried create (same tenant, same Idempotency-Key) names the same execution,
and gets it back only if it is the same request. Sessions alike."""

import hashlib
import secrets
from collections.abc import Awaitable, Callable

from sandpod_contract.names import REQUEST_HASH_ANNOTATION

from sandpod_gateway.kube.resources import Resource, belongs_to
from sandpod_gateway.kube.service import ResourceNotFound
from sandpod_gateway.policy.auth import Tenant
from sandpod_gateway.web.errors import ErrorDetail, GatewayError

NAME_PREFIX = "cx-"
SESSION_PREFIX = "cxs-"

Getter = Callable[[str, str], Awaitable[Resource]]


def resource_name(prefix: str, tenant: str, idempotency_key: str | None) -> str:
    """The CR name: derived from tenant and Idempotency-Key, so a retry names the same CR."""
    if idempotency_key is None:
        return prefix + secrets.token_hex(8)
    digest = hashlib.sha256(f"{tenant}\n{idempotency_key}".encode()).hexdigest()
    return prefix + digest[:20]


def execution_name(tenant: str, idempotency_key: str | None) -> str:
    return resource_name(NAME_PREFIX, tenant, idempotency_key)


async def replay(get: Getter, tenant: Tenant, name: str, fingerprint: str) -> Resource | None:
    """The resource an earlier request with this Idempotency-Key created, if any (`get`
    reads an execution or a session)."""
    try:
        resource = await get(tenant.namespace, name)
    except ResourceNotFound:
        return None
    annotations = (resource.get("metadata") or {}).get("annotations") or {}
    same_request = annotations.get(REQUEST_HASH_ANNOTATION) == fingerprint
    if not belongs_to(resource, tenant.name) or not same_request:
        raise GatewayError(
            409,
            "idempotency_key_reused",
            "This Idempotency-Key was already used for a different request.",
            [ErrorDetail(field="header.idempotency-key", message="reused", type="idempotency_key")],
        )
    return resource

"""API keys and tenants.

The keys live hashed in a Kubernetes Secret (key ``tenants.yaml``, format in
docs/gateway.md). A tenant is a namespace plus limits. The Secret is read on
first use and again whenever the cached copy is older than the refresh
interval; if a refresh fails the previous copy keeps serving.
"""

import asyncio
import base64
import hashlib
import hmac
import logging
import re
import time
from dataclasses import dataclass
from typing import Protocol

import yaml
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic.alias_generators import to_camel
from sandpod_contract.models import (
    DEFAULT_MAX_STORED_BYTES,
    DNS_LABEL_PATTERN,
    MAX_FILE_CHARS,
    IdleTimeoutSeconds,
    LifetimeSeconds,
    LintRules,
)
from sandpod_contract.quantities import Quantity

TENANTS_SECRET_KEY = "tenants.yaml"

logger = logging.getLogger(__name__)


class _CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class TenantLimits(_CamelModel):
    max_timeout_seconds: int = Field(default=60, ge=1)
    max_memory: Quantity = "512Mi"
    max_cpu: Quantity = "1"
    max_concurrent: int = Field(default=5, ge=1)
    max_open_waits: int = Field(
        default=20,
        ge=1,
        description="Requests waiting for a result plus output streams open at once, per "
        "gateway replica.",
    )
    max_inline_file_bytes: int = Field(
        default=256 * 1024,
        ge=0,
        description="Bytes of output files returned inline (content_base64) in one result, "
        "in total; the rest by GET /v1/executions/{id}/files/{path}.",
    )
    max_waits_per_execution: int = Field(
        default=4,
        ge=1,
        description="Of those, on one execution (retries with one Idempotency-Key included).",
    )
    max_sessions: int = Field(default=5, ge=1, description="Sessions not yet ended, at once.")
    max_idle_timeout_seconds: IdleTimeoutSeconds = 1800
    max_lifetime_seconds: LifetimeSeconds = 7200
    max_file_bytes: int = Field(
        default=MAX_FILE_CHARS,
        ge=1,
        le=MAX_FILE_CHARS,
        description="Largest file uploaded to or downloaded from a session.",
    )
    max_stored_bytes: int = Field(
        default=DEFAULT_MAX_STORED_BYTES,
        ge=1,
        description="Bytes the executions of the tenant's namespace may keep (their spec and "
        "status as JSON, their stored output files); a create beyond is refused with 429 "
        "stored_bytes_limit.",
    )
    requests_per_second: int = Field(
        default=50,
        ge=1,
        description="Requests per second the tenant's API keys may make, on average, across "
        "the gateway's replicas; beyond, 429 rate_limited.",
    )
    request_burst: int = Field(
        default=100,
        ge=1,
        description="Requests the tenant may make at once above that rate (the bucket's size).",
    )


class ApiKeyEntry(_CamelModel):
    name: str | None = None
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the key")

    @field_validator("sha256", mode="before")
    @classmethod
    def lowercase(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class TenantConfig(_CamelModel):
    namespace: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    limits: TenantLimits = Field(default_factory=TenantLimits)
    lint: LintRules | None = Field(
        default=None,
        description="The rules its lints check, instead of the language's (for languages "
        "whose catalog entry has lintRules).",
    )
    api_keys: list[ApiKeyEntry] = Field(default_factory=list)


class TenantsConfig(_CamelModel):
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)

    @field_validator("tenants")
    @classmethod
    def tenant_names_are_labels(cls, tenants: dict[str, TenantConfig]) -> dict[str, TenantConfig]:
        for name in tenants:
            if len(name) > 63 or not re.fullmatch(DNS_LABEL_PATTERN, name):
                raise ValueError(f"tenant name {name!r} must be a DNS label (a-z, 0-9, -)")
        return tenants


@dataclass(frozen=True)
class Tenant:
    name: str
    namespace: str
    limits: TenantLimits
    lint: LintRules | None = None


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse_tenants_config(text: str) -> TenantsConfig:
    """Parse the Secret's tenants.yaml; ValueError with a readable message if it is wrong."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{TENANTS_SECRET_KEY} is not valid YAML: {exc}") from exc
    try:
        return TenantsConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{TENANTS_SECRET_KEY} is not valid: {exc}") from exc


class KeyIndex:
    """Resolves API keys to tenants, comparing hashes in constant time."""

    def __init__(self, config: TenantsConfig) -> None:
        self._entries: list[tuple[bytes, Tenant]] = []
        for name, tenant_config in config.tenants.items():
            tenant = Tenant(
                name=name,
                namespace=tenant_config.namespace or name,
                limits=tenant_config.limits,
                lint=tenant_config.lint,
            )
            for key in tenant_config.api_keys:
                self._entries.append((bytes.fromhex(key.sha256), tenant))

    def resolve(self, key: str) -> Tenant | None:
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        found: Tenant | None = None
        # Look at every entry, so the time taken does not depend on which one matches.
        for candidate, tenant in self._entries:
            if hmac.compare_digest(candidate, digest):
                found = tenant
        return found

    def tenant(self, name: str) -> Tenant | None:
        """The tenant of that name (with at least one key)."""
        return next((tenant for _, tenant in self._entries if tenant.name == name), None)


class KeyStoreUnavailable(Exception):
    """The API keys could not be loaded (and none were loaded before)."""


class ApiKeyStore(Protocol):
    async def authenticate(self, key: str) -> Tenant | None: ...

    async def tenant(self, name: str) -> Tenant | None:
        """The tenant of that name, for a credential that names it (an E2B access token)."""
        ...

    async def check_ready(self) -> None:
        """Raise KeyStoreUnavailable if keys cannot be served."""


class SecretApiKeyStore:
    """API keys from a Kubernetes Secret, cached for ``refresh_seconds``."""

    def __init__(
        self, api_client: ApiClient, namespace: str, secret_name: str, refresh_seconds: float
    ) -> None:
        self._core = CoreV1Api(api_client)
        self._namespace = namespace
        self._secret_name = secret_name
        self._refresh_seconds = refresh_seconds
        self._index: KeyIndex | None = None
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()

    async def authenticate(self, key: str) -> Tenant | None:
        index = await self._current_index()
        return index.resolve(key)

    async def tenant(self, name: str) -> Tenant | None:
        index = await self._current_index()
        return index.tenant(name)

    async def check_ready(self) -> None:
        await self._current_index()

    async def _current_index(self) -> KeyIndex:
        if self._index is not None and not self._is_stale():
            return self._index
        async with self._lock:
            if self._index is None or self._is_stale():
                await self._refresh()
            assert self._index is not None
            return self._index

    def _is_stale(self) -> bool:
        return time.monotonic() - self._loaded_at >= self._refresh_seconds

    async def _refresh(self) -> None:
        try:
            self._index = KeyIndex(await self._load())
        except (ApiException, ValueError, OSError) as exc:
            if self._index is None:
                raise KeyStoreUnavailable(str(exc)) from exc
            logger.warning("keeping the previous API keys; reloading them failed: %s", exc)
        # Also after a failure: while older keys serve, a broken Secret is retried once per
        # interval, not on every request.
        self._loaded_at = time.monotonic()

    async def _load(self) -> TenantsConfig:
        try:
            secret = await self._core.read_namespaced_secret(self._secret_name, self._namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise ValueError(
                    f"Secret {self._namespace}/{self._secret_name} does not exist"
                ) from exc
            raise
        encoded = (secret.data or {}).get(TENANTS_SECRET_KEY)
        if encoded is None:
            raise ValueError(
                f"Secret {self._namespace}/{self._secret_name} has no key {TENANTS_SECRET_KEY}"
            )
        return parse_tenants_config(base64.b64decode(encoded).decode("utf-8"))

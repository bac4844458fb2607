"""Gateway configuration, read from SANDPOD_GATEWAY_* environment variables."""

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sandpod_contract.catalog import DEFAULT_CATALOG_PATH
from sandpod_contract.models import CPU_BOUNDS, MAX_CONTENT_CHARS, MAX_TTL_SECONDS, MEMORY_BOUNDS

SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str:
    """The namespace the gateway runs in (its service account's), or sandpod-system."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip() or "sandpod-system"
    except OSError:
        return "sandpod-system"


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDPOD_GATEWAY_")

    kubeconfig: Path | None = Field(
        default=None,
        description="Kubeconfig file; unset: in-cluster config, "
        "else $KUBECONFIG or ~/.kube/config.",
    )
    catalog_path: Path = Field(
        default=DEFAULT_CATALOG_PATH,
        description="Language catalog; the same file the operator reads.",
    )
    api_keys_secret: str = "sandpod-api-keys"
    api_keys_namespace: str = Field(default_factory=own_namespace)
    api_keys_refresh_seconds: float = Field(default=30.0, gt=0)

    default_timeout_seconds: int = Field(default=10, ge=1)
    default_memory: Annotated[str, AfterValidator(MEMORY_BOUNDS.check)] = "256Mi"
    default_cpu: Annotated[str, AfterValidator(CPU_BOUNDS.check)] = Field(
        default="500m",
        description="cpu of a request that names none (within the tenant's maxCpu); keep it "
        "the operator's default.",
    )
    ttl_seconds_after_finished: int = Field(default=3600, ge=0, le=MAX_TTL_SECONDS)
    wait_margin_seconds: float = Field(
        default=120.0,
        ge=0,
        description="How long a waiting request waits beyond the execution's own timeout "
        "(scheduling, image pull, sandbox start).",
    )
    max_code_bytes: int = Field(
        default=256 * 1024,
        ge=1,
        le=MAX_CONTENT_CHARS,
        description="Largest code + files + stdin an execution may carry (UTF-8 bytes).",
    )
    max_request_bytes: int = Field(default=1024 * 1024, ge=1024)
    default_retry_after_seconds: int = Field(default=5, ge=1)
    direct_service: str = Field(
        default="",
        description="The operator's direct path as its Service, namespace/name:port (its "
        "cluster IP is read through the API: no DNS needed): runs in live sessions go there "
        "and answer without waiting on the API server. Empty, and no direct_url: they take the "
        "record path (a CodeExecution the operator reconciles).",
    )
    direct_url: str = Field(
        default="",
        description="Or the operator's direct path as a URL (http://host:port), e.g. an "
        "operator on this machine.",
    )
    direct_token_file: str = Field(
        default="",
        description="A file holding the token the operator's direct path expects.",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        description="Gateway replicas serving together (the chart sets it from "
        "gateway.replicas): each takes this share of a tenant's request rate and burst.",
    )
    max_log_follows: int = Field(
        default=200, ge=1, description="Pod logs this replica follows at once (all tenants)."
    )
    max_log_follow_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Bytes of one pod's log a stream reads at most (the rest of the output "
        "is in the result).",
    )
    judge0_callback_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts (name, or name:port) a Judge0 submission's callback_url may name; "
        "the gateway PUTs the result there when the submission is done. Empty: callback_url "
        "is refused.",
    )
    judge0_queue_size: int = Field(
        default=100,
        ge=0,
        description="Judge0 submissions of one tenant that may wait beyond its maxConcurrent "
        "(status In Queue; the operator starts them in turn); more are refused with 503 "
        "'queue is full'. Judge0's MAX_QUEUE_SIZE.",
    )
    judge0_max_batch_size: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="Submissions one POST /judge0/submissions/batch may hold (Judge0's "
        "MAX_SUBMISSION_BATCH_SIZE; its default is 20, a class's batch is larger).",
    )
    max_upload_parts: int = Field(
        default=32,
        ge=1,
        le=1000,
        description="Parts one E2B multipart upload (POST /e2b/sandbox/files, the SDK's "
        "write_files) may hold; more are refused with 400. Each part is a run in the sandbox "
        "and counts as a request against the tenant's rate.",
    )
    mcp_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host headers the MCP endpoint accepts (DNS-rebinding protection); "
        "empty: any host (every request needs an API key anyway).",
    )

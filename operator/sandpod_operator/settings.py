"""Operator settings, read from SANDPOD_* environment variables."""

from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sandpod_contract.catalog import DEFAULT_CATALOG_PATH
from sandpod_contract.egress_grant import valid_host_pattern
from sandpod_contract.models import (
    DEFAULT_MAX_STORED_BYTES,
    MAX_COMPILE_TIMEOUT_SECONDS,
    MAX_TIMEOUT_SECONDS,
    MAX_TTL_SECONDS,
)
from sandpod_contract.quantities import Quantity, parse_quantity

from sandpod_operator.egress.policy import (
    CLUSTER_RANGE_KINDS,
    EgressBounds,
    make_bounds,
    parse_network,
)

# Where the sandbox images keep the runner, and where sandbox pods mount its config.
RUNNER_PATH = "/opt/sandpod/bin/sandpod-runner"
INPUT_DIR = "/sandbox/input"
CONFIG_KEY = "config.json"


def _valid_network(text: str) -> str:
    parse_network(text)
    return text


Cidr = Annotated[str, AfterValidator(_valid_network)]


def _valid_host_pattern(text: str) -> str:
    if not valid_host_pattern(text):
        raise ValueError(f"{text!r} is not a host name or *. and a domain")
    return text


HostPattern = Annotated[str, AfterValidator(_valid_host_pattern)]


class OperatorSettings(BaseSettings):
    """Everything an installation may tune. Limits here may only be lower than the CRD's."""

    model_config = SettingsConfigDict(env_prefix="SANDPOD_", extra="ignore", frozen=True)

    runtime_class_name: str = Field(
        default="gvisor", description="RuntimeClass of sandbox pods whose spec names none."
    )
    allowed_runtime_classes: list[str] = Field(
        default_factory=list,
        description="Further RuntimeClasses a spec may name (JSON list). The default class is "
        "always allowed; any other would let a user pick a weaker sandbox.",
    )
    catalog_path: Path = Field(default=DEFAULT_CATALOG_PATH, description="Language catalog.")

    default_cpu: Quantity = "500m"
    max_cpu: Quantity = "2"
    cpu_request: Quantity = Field(
        default="50m",
        description="CPU request of every sandbox (capped at its limit): small, so that a "
        "2-core node schedules many sandboxes; the limit bounds each one.",
    )
    default_memory: Quantity = "256Mi"
    max_memory: Quantity = Field(
        default="2Gi",
        description="Largest memory limit a spec may ask for. The request equals the limit, "
        "so the node never overcommits memory to sandboxes.",
    )
    pool_runs_per_sandbox: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Runs a one-off pool's pod serves, each in a fresh box, unless the pool "
        "says (runsPerSandbox); 1: a pod per run.",
    )
    pool_sandbox_max_age_seconds: int = Field(
        default=3600,
        ge=1,
        le=7 * 24 * 3600,
        description="Age past which a one-off pool's pod takes no further run, unless the pool "
        "says (sandboxMaxAgeSeconds).",
    )
    pool_wait_seconds: float = Field(
        default=2.0,
        ge=0,
        le=30,
        description="How long a one-off run through the gateway waits for a pool pod of its "
        "tenant to finish another run before it starts a sandbox of its own.",
    )
    sandbox_memory_overhead: Quantity = Field(
        default="64Mi",
        description="Memory a sandbox pod gets beyond its program's limit, for the runner and "
        "gVisor itself: the runner ends a run that holds more than its own limit (OOMKilled, "
        "within 10 ms), before the pod's limit (limit + this) is reached, so the sandbox and "
        "its answer survive the run.",
    )
    default_ephemeral_storage: Quantity = "256Mi"
    max_ephemeral_storage: Quantity = "1Gi"
    ephemeral_storage_request: Quantity = "16Mi"
    tmp_size_limit: Quantity = Field(
        default="128Mi",
        description="sizeLimit of the /tmp emptyDir (capped at the ephemeral-storage limit).",
    )

    max_timeout_seconds: int = Field(default=MAX_TIMEOUT_SECONDS, ge=1, le=MAX_TIMEOUT_SECONDS)
    compile_timeout_seconds: int = Field(
        default=30,
        ge=1,
        le=MAX_COMPILE_TIMEOUT_SECONDS,
        description="The build's own time limit (compiled languages: go, csharp), apart from "
        "the program's timeout: a run's deadlines add it (sandpod_contract.catalog.run_seconds). "
        "A build killed at it ends TimedOut.",
    )
    default_ttl_seconds: int = Field(default=3600, ge=0, le=MAX_TTL_SECONDS)

    status_output_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        le=256 * 1024,
        description="Bytes of each of stdout and stderr kept in status (the tail). The whole "
        "object must fit etcd's 1.5 MiB with the spec.",
    )
    max_output_files: int = Field(
        default=64,
        ge=0,
        le=1024,
        description="Files the runner brings back from /tmp/outputs per run, at most.",
    )
    max_output_files_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=0,
        le=64 * 1024 * 1024,
        description="Bytes the runner brings back from /tmp/outputs per run, at most (a "
        "larger file is skipped by its size, never read).",
    )
    outputs_stored_bytes: int = Field(
        default=768 * 1024,
        ge=0,
        le=900 * 1024,
        description="Bytes of output files stored per execution in its ConfigMap "
        "status.outputsConfigMap (a ConfigMap holds at most 1 MiB); files past it are listed in "
        "status with stored: false.",
    )
    max_diagnostics: int = Field(default=200, ge=0, description="Lint findings kept in status.")
    log_read_limit_bytes: int = Field(
        default=64 * 1024 * 1024, ge=64 * 1024, description="Most pod log bytes read per run."
    )

    sandbox_uid: int = Field(default=65532, ge=1)
    sandbox_gid: int = Field(default=65532, ge=1)
    process_limit: int = Field(default=128, ge=1, description="RLIMIT_NPROC in the sandbox.")
    file_size_limit_bytes: int = Field(default=100 * 1024 * 1024, ge=1, description="RLIMIT_FSIZE.")
    open_files_limit: int = Field(default=1024, ge=16, description="RLIMIT_NOFILE.")

    # 60 s ended runs that would have succeeded: on a 2-core node, a burst of ~45 gVisor
    # sandboxes takes over a minute to reach a running program.
    pod_startup_timeout_seconds: int = Field(
        default=120,
        ge=5,
        description="How long a sandbox may take for each step toward a running program "
        "(scheduled; sandbox and network ready; containers created and started) before the "
        "execution ends with Error/StartupTimeout: each step restarts the clock, and so does "
        "a step of another sandbox on its node, so a busy node is slow, not stuck.",
    )
    queue_timeout_seconds: int = Field(
        default=300,
        ge=0,
        description="How long an execution may wait (Pending, condition Queued) for room on a "
        "node before Error/Unschedulable. One that asks for more than the largest node has "
        "ends at once.",
    )
    deadline_grace_seconds: float = Field(
        default=10.0,
        ge=0,
        le=60,
        description="The operator ends a program still running this long after its timeout "
        "(counted from the container's start as the kubelet saw it) with TimedOut and "
        "removes its pod, whatever became of the runner. The runner's own timer starts "
        "later, when the program starts: on a busy node that can be seconds after the "
        "container's start.",
    )
    resync_after_seconds: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="An execution seen without a status this long after its creation is "
        "touched (annotation sandpod.dev/resync-at) so that the operator looks at it again, "
        "e.g. after an API server restart left kopf with a stale copy; again at this interval "
        "while it has none.",
    )
    direct_port: int = Field(
        default=8081,
        ge=0,
        le=65535,
        description="The port of the direct path (runs in live sessions, from the gateway "
        "alone); 0 (or no direct_token_file) turns it off and session runs take the record "
        "path.",
    )
    direct_token_file: str = Field(
        default="",
        description="A file holding the token the gateway presents on the direct path.",
    )
    records_kept_per_namespace: int = Field(
        default=1000,
        ge=1,
        description="Records of direct runs kept per namespace; beyond it the oldest finished "
        "ones are deleted (each also goes after its ttlSecondsAfterFinished).",
    )
    records_sweep_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How often records of direct runs are looked over (TTL, the bound, runs "
        "an operator restart cut off).",
    )
    namespace_max_stored_bytes: dict[str, int | None] = Field(
        default_factory=dict,
        description="Per tenant namespace, the bytes its executions may keep (JSON object; the "
        "chart renders its tenants' maxStoredBytes): an execution created over it with kubectl "
        "ends Failed/StoredBytesLimit without running. null: the default bound "
        "(DEFAULT_MAX_STORED_BYTES, as the gateway's); namespaces not listed have none.",
    )

    def stored_bytes_bounds(self) -> dict[str, int]:
        """Each tenant namespace's bound, the default where none was set."""
        return {
            namespace: DEFAULT_MAX_STORED_BYTES if bound is None else bound
            for namespace, bound in self.namespace_max_stored_bytes.items()
        }

    admission_hold_seconds: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="How long a create the gateway was admitted for counts before its object "
        "is seen (it counts from then on as the object).",
    )
    session_queue_limit: int = Field(
        default=16,
        ge=1,
        le=1000,
        description="Runs of one session sent through the direct path that may run or wait "
        "at once; more are refused (the gateway answers 429 with Retry-After).",
    )
    stalled_after_seconds: float = Field(
        default=60.0,
        ge=5,
        le=3600,
        description="The operator's liveness probe fails (and the kubelet restarts it) when no "
        "handler has run this long after its start, or none has seen an execution this long "
        "after the resync touched it: kopf then holds every handler (a watch that ended before "
        "its first listing).",
    )
    watchdog_interval_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often unfinished executions are re-checked for time-based verdicts "
        "(startup timeout, unschedulable, lost pods).",
    )

    runner_ingress_from: list[dict[str, Any]] = Field(
        default_factory=list,
        description="NetworkPolicyPeer objects (JSON list) that may reach the serving runner "
        "of pool pods (the operator itself); empty: no runner ingress policy, so nothing "
        "reaches pool pods.",
    )
    pool_runner_command: list[str] = Field(
        default_factory=lambda: [RUNNER_PATH, "--serve", f"{INPUT_DIR}/{CONFIG_KEY}"],
        min_length=1,
        description="argv of pool pods: the runner serving on the runner port, ready (GET "
        "/ready) once its program's process is pre-started.",
    )
    pool_resync_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How often each pool is checked even without events.",
    )
    egress_open_cidrs: list[Cidr] = Field(
        default_factory=list,
        description="Ranges an egress allowlist may name although they are not public or "
        "belong to the cluster, e.g. a test network (JSON list). An entry inside one is "
        "accepted as it is: open the narrowest range you mean. Cluster DNS is reachable only "
        "if opened here.",
    )
    egress_node_cidrs: list[Cidr] = Field(
        default_factory=list, description="The nodes' addresses: never in an allowlist."
    )
    egress_pod_cidrs: list[Cidr] = Field(
        default_factory=list, description="The pod network: never in an allowlist."
    )
    egress_service_cidrs: list[Cidr] = Field(
        default_factory=list,
        description="The service network (cluster DNS included): never in an allowlist.",
    )
    egress_api_server_cidrs: list[Cidr] = Field(
        default_factory=list, description="The API server's addresses: never in an allowlist."
    )
    egress_namespace_cidrs: dict[str, list[Cidr]] = Field(
        default_factory=dict,
        description="Per namespace (tenant), the only ranges its allowlists may name, within "
        "the platform's bounds (JSON object); an empty list: no allowlist at all.",
    )
    egress_namespace_hosts: dict[str, list[HostPattern]] = Field(
        default_factory=dict,
        description="Per namespace (tenant), the only hosts its allowlists may name (JSON "
        "object of lists; *.domain covers the names below it); an empty list: no host at all. "
        "Namespaces not listed may name any host (the proxy still reaches only public "
        "addresses).",
    )
    egress_proxy_service: str = Field(
        default="",
        pattern=r"^([a-z0-9-]+/[a-z0-9-]+)?$",
        description="namespace/name of the egress proxy's Service (the chart's); empty: no "
        "proxy, and allowlists may name no hosts.",
    )
    egress_proxy_port: int = Field(default=3128, ge=1, le=65535, description="Its proxy port.")
    egress_proxy_monitor_port: int = Field(
        default=9180,
        ge=1,
        le=65535,
        description="The port of its monitor (refused requests per execution, metrics).",
    )
    egress_proxy_pod_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels of the proxy's pods, which a sandbox's NetworkPolicy opens (JSON).",
    )
    egress_proxy_key_file: Path | None = Field(
        default=None,
        description="The key that signs per-execution proxy credentials (shared with the proxy).",
    )

    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="Serve Prometheus metrics here (0: off)."
    )

    @model_validator(mode="after")
    def _defaults_within_maximums(self) -> "OperatorSettings":
        pairs = [
            ("default_cpu", "max_cpu"),
            ("default_memory", "max_memory"),
            ("default_ephemeral_storage", "max_ephemeral_storage"),
        ]
        for default, maximum in pairs:
            if parse_quantity(getattr(self, default)) > parse_quantity(getattr(self, maximum)):
                raise ValueError(f"{default} must not exceed {maximum}")
        return self

    @property
    def runtime_classes(self) -> frozenset[str]:
        return frozenset([self.runtime_class_name, *self.allowed_runtime_classes])

    @property
    def egress_bounds(self) -> EgressBounds:
        cluster = [(what, getattr(self, name)) for name, what in CLUSTER_RANGE_KINDS]
        return make_bounds(
            cluster,
            self.egress_open_cidrs,
            self.egress_namespace_cidrs,
            self.egress_namespace_hosts,
        )

    @property
    def longest_run_seconds(self) -> int:
        """The most any run's time (sandpod_contract.catalog.run_seconds) can be: the largest
        timeout with the build's limit."""
        return self.max_timeout_seconds + self.compile_timeout_seconds

    @property
    def active_deadline_seconds_margin(self) -> int:
        """Added to the timeout for the pod's activeDeadlineSeconds (a backstop only)."""
        return self.pod_startup_timeout_seconds + 30

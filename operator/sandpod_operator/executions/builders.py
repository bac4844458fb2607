"""Pure builders: a CodeExecution spec (+ catalog, settings) -> plain Kubernetes manifests.

No I/O here. Handlers add ownerReferences (kopf.adopt) and create what these return.
The ConfigMap layout and config.json follow docs/runner-protocol.md.
"""

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandpod_contract.catalog import Catalog, Language, builds, run_seconds
from sandpod_contract.models import CodeExecutionSpec, Network, Resources
from sandpod_contract.names import (
    EXECUTION_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ROLE_LABEL,
    SANDBOX_ROLE,
    child_name,
    outputs_configmap_name,
)
from sandpod_contract.quantities import added_quantities, parse_quantity, smaller_quantity
from sandpod_contract.runner import VerifiedFile

from sandpod_operator.egress.policy import (
    NO_PROXY_MESSAGE,
    EgressBounds,
    excepts,
    host_refusal,
    refusal,
)
from sandpod_operator.egress.proxy import EgressProxy, proxy_rule
from sandpod_operator.kube import Manifest
from sandpod_operator.settings import CONFIG_KEY, INPUT_DIR, RUNNER_PATH, OperatorSettings

DENY_ALL_POLICY_NAME = "sandpod-sandbox-deny-all"

CONTAINER_NAME = "sandbox"
SANDBOX_HOSTNAME = "sandbox"
SOURCE_KEY = "source"
STDIN_KEY = "stdin"
TERMINATION_GRACE_SECONDS = 1
# The sandbox has no DNS: the resolver points at loopback, where nothing answers.
UNREACHABLE_NAMESERVER = "127.0.0.1"

# A ConfigMap holds at most 1 MiB; leave room for config.json and keys.
MAX_CONTENT_BYTES = 1000 * 1000


class InvalidSpecError(ValueError):
    """The spec passed the CRD schema but this operator cannot run it (catalog, settings)."""


@dataclass(frozen=True)
class Sandbox:
    """What every sandbox pod is made of (one-off or pooled): language, RuntimeClass, limits."""

    language: Language
    runtime_class_name: str
    cpu: str
    memory: str
    ephemeral_storage: str


@dataclass(frozen=True)
class Plan(Sandbox):
    """The spec resolved against the catalog and settings: what will actually run."""

    timeout_seconds: int
    ttl_seconds_after_finished: int
    mode: str
    compile_timeout_seconds: int

    @property
    def builds(self) -> bool:
        """The run builds its source before the program runs."""
        return builds(self.language, self.mode)

    @property
    def run_seconds(self) -> int:
        """The run's time: its timeout, plus the build's limit when it builds."""
        return run_seconds(
            self.language, self.mode, self.timeout_seconds, self.compile_timeout_seconds
        )


def content_size_bytes(spec: CodeExecutionSpec) -> int:
    texts = [spec.source, spec.stdin or "", *(f.content for f in spec.files)]
    return sum(len(text.encode()) for text in texts)


def sandbox_labels(owner_name: str, owner_label: str = EXECUTION_LABEL) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: MANAGED_BY,
        owner_label: owner_name,
        ROLE_LABEL: SANDBOX_ROLE,
    }


def _within(what: str, requested: str | None, default: str, maximum: str) -> str:
    value = requested or default
    if parse_quantity(value) > parse_quantity(maximum):
        raise InvalidSpecError(
            f"spec.resources.{what}: {value} exceeds this installation's maximum of {maximum}"
        )
    return value


def catalog_language(name: str, catalog: Catalog) -> Language:
    language = catalog.languages.get(name)
    if language is None:
        known = ", ".join(sorted(catalog.languages))
        raise InvalidSpecError(f"spec.language: unknown language {name!r} ({known})")
    return language


def limits_within(resources: Resources, settings: OperatorSettings) -> dict[str, str]:
    """cpu, memory and ephemeral storage with the defaults filled in, each at most the
    installation's maximum (Sandbox's field names)."""
    return {
        "cpu": _within("cpu", resources.cpu, settings.default_cpu, settings.max_cpu),
        "memory": _within("memory", resources.memory, settings.default_memory, settings.max_memory),
        "ephemeral_storage": _within(
            "ephemeralStorage",
            resources.ephemeral_storage,
            settings.default_ephemeral_storage,
            settings.max_ephemeral_storage,
        ),
    }


def plan_execution(spec: CodeExecutionSpec, catalog: Catalog, settings: OperatorSettings) -> Plan:
    """Resolve defaults and check what the CRD cannot know; InvalidSpecError names the field."""
    language = catalog_language(spec.language, catalog)
    if spec.mode == "lint" and language.lint_command is None:
        raise InvalidSpecError(f"spec.mode: {spec.language} has no linter; use mode run")
    if spec.lint is not None and language.lint_rules is None:
        raise InvalidSpecError(f"spec.lint: the linter of {spec.language} takes no rules")
    if spec.timeout_seconds > settings.max_timeout_seconds:
        raise InvalidSpecError(
            f"spec.timeoutSeconds: {spec.timeout_seconds} exceeds this installation's maximum "
            f"of {settings.max_timeout_seconds}"
        )
    runtime_class = spec.runtime_class_name or settings.runtime_class_name
    if runtime_class not in settings.runtime_classes:
        allowed = ", ".join(sorted(settings.runtime_classes))
        raise InvalidSpecError(
            f"spec.runtimeClassName: {runtime_class!r} is not allowed here ({allowed})"
        )
    content_bytes = content_size_bytes(spec)
    if content_bytes > MAX_CONTENT_BYTES:
        raise InvalidSpecError(
            f"spec.source: source, stdin and files take {content_bytes} bytes as UTF-8; "
            f"at most {MAX_CONTENT_BYTES} fit in the sandbox's ConfigMap"
        )
    clashing = [f.path for f in spec.files if f.path == language.file]
    if clashing:
        raise InvalidSpecError(
            f"spec.files: {clashing[0]!r} would overwrite the program's own file"
        )
    ttl = spec.ttl_seconds_after_finished
    return Plan(
        language=language,
        runtime_class_name=runtime_class,
        **limits_within(spec.resources, settings),
        timeout_seconds=spec.timeout_seconds,
        ttl_seconds_after_finished=settings.default_ttl_seconds if ttl is None else ttl,
        mode=spec.mode,
        compile_timeout_seconds=settings.compile_timeout_seconds,
    )


def file_key(index: int) -> str:
    return f"file-{index}"


def language_config(
    language: Language, settings: OperatorSettings, extra_env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The part of config.json that depends only on the language and the installation (and
    on the sandbox's egress proxy: `extra_env`, its variables over the language's)."""
    return {
        "sourceFile": language.file,
        "command": list(language.command),
        "env": {**language.env, **(extra_env or {})},
        "limits": {
            "processes": settings.process_limit,
            "fileSizeBytes": settings.file_size_limit_bytes,
            "openFiles": settings.open_files_limit,
        },
    }


def build_runner_config(
    spec: CodeExecutionSpec,
    plan: Plan,
    settings: OperatorSettings,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """config.json for the runner (docs/runner-protocol.md); `extra_env` (the egress proxy's
    variables) over the language's environment."""
    config: dict[str, Any] = {
        "mode": spec.mode,
        **language_config(plan.language, settings, extra_env),
        "args": list(spec.args),
        "timeoutSeconds": plan.timeout_seconds,
        "maxOutputBytes": spec.max_output_bytes,
        "maxOutputFiles": settings.max_output_files,
        "maxOutputFilesBytes": settings.max_output_files_bytes,
        "files": [{"key": file_key(i), "path": f.path} for i, f in enumerate(spec.files)],
        "hasStdin": spec.stdin is not None,
        "memoryLimitBytes": int(parse_quantity(plan.memory)),
    }
    if plan.language.lint_command is not None:
        rules = spec.lint or plan.language.lint_rules
        options = rules.arguments() if rules is not None else []
        config["lintCommand"] = [*plan.language.lint_command, *options]
    if plan.builds:
        config.update(compile_config(plan.language, settings))
    return config


def compile_config(language: Language, settings: OperatorSettings) -> dict[str, Any]:
    """config.json's compile step for a language that builds: its command and time limit."""
    assert language.compile_command is not None
    return {
        "compileCommand": list(language.compile_command),
        "compileTimeoutSeconds": settings.compile_timeout_seconds,
    }


def build_configmap(
    *,
    namespace: str,
    execution_name: str,
    uid: str,
    spec: CodeExecutionSpec,
    plan: Plan,
    settings: OperatorSettings,
    extra_env: Mapping[str, str] | None = None,
) -> Manifest:
    config = build_runner_config(spec, plan, settings, extra_env)
    data = {
        CONFIG_KEY: json.dumps(config, indent=2) + "\n",
        SOURCE_KEY: spec.source,
    }
    if spec.stdin is not None:
        data[STDIN_KEY] = spec.stdin
    binary_data = {}
    for index, extra in enumerate(spec.files):
        if extra.encoding == "base64":
            binary_data[file_key(index)] = extra.content
        else:
            data[file_key(index)] = extra.content
    manifest: Manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": child_name(execution_name, uid),
            "namespace": namespace,
            "labels": sandbox_labels(execution_name),
        },
        # Immutable: kubelets need not watch it, and nobody can swap the code under a run.
        "immutable": True,
        "data": data,
    }
    if binary_data:
        manifest["binaryData"] = binary_data
    return manifest


def plan_outputs(files: Sequence[VerifiedFile], limit_bytes: int) -> list[dict[str, Any]]:
    """Status entries of the verified output files, in the runner's order: stored under
    file-0, file-1, ... while they fit in `limit_bytes` together, else listed only."""
    entries: list[dict[str, Any]] = []
    room, stored_count = limit_bytes, 0
    for file in files:
        stored = file.content is not None and file.size <= room
        entry: dict[str, Any] = {
            "path": file.path,
            "size": file.size,
            "sha256": file.sha256,
            "media_type": file.media_type,
            "stored": stored,
        }
        if stored:
            entry["key"] = file_key(stored_count)
            room, stored_count = room - file.size, stored_count + 1
        entries.append(entry)
    return entries


def build_outputs_configmap(
    *,
    namespace: str,
    execution_name: str,
    uid: str,
    files: Sequence[VerifiedFile],
    entries: list[dict[str, Any]],
) -> Manifest | None:
    """The ConfigMap holding the stored output files (binaryData), or None if none is."""
    contents = {file.path: file.content for file in files}
    binary_data = {
        entry["key"]: base64.b64encode(contents[entry["path"]] or b"").decode()
        for entry in entries
        if entry["stored"]
    }
    if not binary_data:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": outputs_configmap_name(execution_name, uid),
            "namespace": namespace,
            "labels": sandbox_labels(execution_name),
        },
        "immutable": True,
        "binaryData": binary_data,
    }


def build_pod(
    *,
    namespace: str,
    execution_name: str,
    uid: str,
    plan: Plan,
    settings: OperatorSettings,
) -> Manifest:
    """The hardened sandbox pod of one execution."""
    name = child_name(execution_name, uid)
    spec = sandbox_pod_spec(
        plan,
        settings,
        command=[RUNNER_PATH, f"{INPUT_DIR}/{CONFIG_KEY}"],
        config_name=name,
    )
    spec["activeDeadlineSeconds"] = plan.run_seconds + settings.active_deadline_seconds_margin
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": sandbox_labels(execution_name),
        },
        "spec": spec,
    }


def sandbox_pod_spec(
    sandbox: Sandbox, settings: OperatorSettings, *, command: list[str], config_name: str
) -> Manifest:
    """Every default of DESIGN.md's "Sandbox pod hardening", running `command` with the
    ConfigMap `config_name` at /sandbox/input."""
    return {
        "runtimeClassName": sandbox.runtime_class_name,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostname": SANDBOX_HOSTNAME,
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": [UNREACHABLE_NAMESERVER]},
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.sandbox_uid,
            "runAsGroup": settings.sandbox_gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER_NAME,
                "image": sandbox.language.image,
                "imagePullPolicy": "IfNotPresent",
                "command": list(command),
                "resources": {
                    "limits": {
                        "cpu": sandbox.cpu,
                        "memory": pod_memory(sandbox, settings),
                        "ephemeral-storage": sandbox.ephemeral_storage,
                    },
                    "requests": {
                        "cpu": smaller_quantity(settings.cpu_request, sandbox.cpu),
                        "memory": pod_memory(sandbox, settings),
                        "ephemeral-storage": smaller_quantity(
                            settings.ephemeral_storage_request, sandbox.ephemeral_storage
                        ),
                    },
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "input", "mountPath": INPUT_DIR, "readOnly": True},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
            }
        ],
        "volumes": [
            {"name": "input", "configMap": {"name": config_name, "defaultMode": 0o444}},
            {"name": "tmp", "emptyDir": scratch_volume(sandbox, settings)},
        ],
    }


def pod_memory(sandbox: Sandbox, settings: OperatorSettings) -> str:
    """The pod's memory: the program's limit (which the runner enforces, memoryLimitBytes)
    and the overhead of the runner and gVisor, so that a run past its own limit is ended by
    the runner with the sandbox intact, never by the kernel taking the whole pod."""
    return added_quantities(sandbox.memory, settings.sandbox_memory_overhead)


def scratch_volume(sandbox: Sandbox, settings: OperatorSettings) -> Manifest:
    """/tmp as a memory-backed emptyDir: the kubelet mounts a tmpfs of exactly sizeLimit, so a
    write past it fails at once with ENOSPC and nothing reaches the node's disk (a disk-backed
    emptyDir is only enforced by eviction, about a minute late). Its pages count toward the
    pod's memory limit, so it is never larger than that limit."""
    size = smaller_quantity(settings.tmp_size_limit, sandbox.ephemeral_storage)
    return {"medium": "Memory", "sizeLimit": smaller_quantity(size, sandbox.memory)}


def check_egress(
    network: Network, bounds: EgressBounds, namespace: str, *, proxy_configured: bool
) -> None:
    """Refuse an allowlist outside the platform's egress bounds (the rule named)."""
    hosts = [str(rule.host) for rule in network.host_rules]
    if hosts and not proxy_configured:
        raise InvalidSpecError(NO_PROXY_MESSAGE)
    message = refusal(
        [str(rule.cidr) for rule in network.cidr_rules], bounds, namespace
    ) or host_refusal(hosts, bounds, namespace)
    if message is not None:
        raise InvalidSpecError(message)


def build_network_policy(namespace: str) -> Manifest:
    """Deny all ingress and egress of every sandbox pod in the namespace (DNS included)."""
    spec = {
        "podSelector": {"matchLabels": {ROLE_LABEL: SANDBOX_ROLE}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    }
    return namespace_policy(namespace, DENY_ALL_POLICY_NAME, spec)


def namespace_policy(namespace: str, name: str, spec: Manifest) -> Manifest:
    """A NetworkPolicy the operator keeps per namespace (not owned by one execution)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        },
        "spec": spec,
    }


def build_egress_policy(
    *,
    namespace: str,
    execution_name: str,
    uid: str,
    network: Network,
    bounds: EgressBounds,
    owner_label: str = EXECUTION_LABEL,
    proxy: EgressProxy | None = None,
) -> Manifest | None:
    """For egress: allowlist, a policy that adds the allowed destinations (policies add up)
    to the pod labelled `owner_label`=`execution_name` (an execution's, or a session's): the
    networks, and the egress proxy's pods when hosts are listed (`proxy` then given).
    Each block leaves out the excluded ranges inside it, should a check ever be skipped."""
    if network.egress != "allowlist":
        return None
    rules = [proxy_rule(proxy)] if proxy is not None and network.host_rules else []
    for allowed in network.cidr_rules:
        cidr = str(allowed.cidr)
        block: dict[str, Any] = {"cidr": cidr}
        if left_out := excepts(cidr, bounds):
            block["except"] = left_out
        rule: dict[str, Any] = {"to": [{"ipBlock": block}]}
        if allowed.ports:
            rule["ports"] = [{"port": p.port, "protocol": p.protocol} for p in allowed.ports]
        rules.append(rule)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": child_name(execution_name, uid),
            "namespace": namespace,
            "labels": sandbox_labels(execution_name, owner_label),
        },
        "spec": {
            "podSelector": {"matchLabels": {owner_label: execution_name, ROLE_LABEL: SANDBOX_ROLE}},
            "policyTypes": ["Egress"],
            "egress": rules,
        },
    }

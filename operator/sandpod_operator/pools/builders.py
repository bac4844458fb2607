"""Pure builders of serving sandboxes: a SandboxPool's pods and serve-config ConfigMap, a
CodeSession's own pod and ConfigMap, and the namespace's NetworkPolicies that let the
operator (alone) reach the serving runners.

No I/O here. The pool controller adds ownerReferences (kopf.adopt) and creates these.
"""

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sandpod_contract.catalog import Catalog
from sandpod_contract.models import DEFAULT_OUTPUT_BYTES, SandboxPoolSpec
from sandpod_contract.names import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    POOL_FREE,
    POOL_LABEL,
    POOL_STATE_LABEL,
    POOL_TEMPLATE_LABEL,
    ROLE_LABEL,
    RUNNER_PORT,
    RUNNER_PORT_NAME,
    SANDBOX_ROLE,
    SESSION_LABEL,
    SESSION_RUNNER_FLAG,
    child_name,
    pool_runner_config_name,
)

from sandpod_operator.executions.builders import (
    InvalidSpecError,
    Sandbox,
    catalog_language,
    compile_config,
    language_config,
    limits_within,
    namespace_policy,
    sandbox_labels,
    sandbox_pod_spec,
)
from sandpod_operator.kube import Manifest
from sandpod_operator.settings import CONFIG_KEY, OperatorSettings

RUNNER_INGRESS_POLICY_NAME = "sandpod-runner-ingress"
SESSION_RUNNER_INGRESS_POLICY_NAME = "sandpod-session-runner-ingress"
READY_PATH = "/ready"
TEMPLATE_HASH_CHARS = 16


def plan_pool(spec: SandboxPoolSpec, catalog: Catalog, settings: OperatorSettings) -> Sandbox:
    """The pool's sandbox, or InvalidSpecError naming the field (unknown language, limits
    above the installation's maximums, a compiled language for sessions). Pool pods run the
    default RuntimeClass; a compiled language's pod starts nothing ahead and builds its one
    run's source when claimed."""
    language = catalog_language(spec.language, catalog)
    if spec.sessions and language.compile_command is not None:
        # A session's runs share one sandbox; none builds its source first.
        raise InvalidSpecError(
            f"spec.language: {spec.language} is compiled before it runs; a pool of sessions "
            "serves languages without a compile step"
        )
    return Sandbox(
        language=language,
        runtime_class_name=settings.runtime_class_name,
        **limits_within(spec.resources, settings),
    )


def pool_labels(pool_name: str, template: str) -> dict[str, str]:
    """A free pool pod's labels: a sandbox (the deny-all policy selects it) of this pool."""
    return {
        MANAGED_BY_LABEL: MANAGED_BY,
        ROLE_LABEL: SANDBOX_ROLE,
        POOL_LABEL: pool_name,
        POOL_STATE_LABEL: POOL_FREE,
        POOL_TEMPLATE_LABEL: template,
    }


def build_serve_configmap(
    *,
    namespace: str,
    name: str,
    labels: dict[str, str],
    sandbox: Sandbox,
    settings: OperatorSettings,
    extra_env: Mapping[str, str] | None = None,
    builds: bool = False,
) -> Manifest:
    """The serve config: a complete config.json for this language, which the runner checks as
    it checks any; the per-execution fields (args, timeout, output cap, files, stdin) come with
    each request and replace these placeholders. Each request's env must be this one
    (`extra_env`: a session's egress proxy variables); with `builds` (a pool's run-once
    sandbox), so must its compile step, which the runner runs when the run arrives."""
    config: dict[str, object] = {
        "mode": "run",
        **language_config(sandbox.language, settings, extra_env),
        "args": [],
        "timeoutSeconds": settings.max_timeout_seconds,
        "maxOutputBytes": DEFAULT_OUTPUT_BYTES,
        "files": [],
        "hasStdin": False,
    }
    if builds and sandbox.language.compile_command is not None:
        config.update(compile_config(sandbox.language, settings))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {CONFIG_KEY: json.dumps(config, indent=2) + "\n"},
    }


def build_pool_configmap(
    *,
    namespace: str,
    pool_name: str,
    spec: SandboxPoolSpec,
    sandbox: Sandbox,
    settings: OperatorSettings,
) -> Manifest:
    """A pool's serve config; a one-off pool's says how many runs a pod serves, each in a box
    of its own, and for how long (maxRuns, maxAgeSeconds)."""
    configmap = build_serve_configmap(
        namespace=namespace,
        name=pool_runner_config_name(pool_name),
        labels={MANAGED_BY_LABEL: MANAGED_BY, POOL_LABEL: pool_name},
        sandbox=sandbox,
        settings=settings,
        builds=True,
    )
    if spec.sessions:
        return configmap
    config = json.loads(configmap["data"][CONFIG_KEY])
    config["maxRuns"] = spec.runs_per_sandbox or settings.pool_runs_per_sandbox
    config["maxAgeSeconds"] = spec.sandbox_max_age_seconds or settings.pool_sandbox_max_age_seconds
    configmap["data"][CONFIG_KEY] = json.dumps(config, indent=2) + "\n"
    return configmap


def template_hash(pod_spec: Manifest, configmap: Manifest) -> str:
    """Identifies what a pool pod is made of: a pod whose label differs is out of date."""
    text = json.dumps([pod_spec, configmap["data"]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:TEMPLATE_HASH_CHARS]


def serve_pod_spec(
    sandbox: Sandbox, settings: OperatorSettings, *, sessions: bool, config_name: str
) -> Manifest:
    """A hardened sandbox pod whose runner serves executions (one, or a session's, one at a
    time): no deadline of its own (the operator enforces each execution's), ready once the
    runner is."""
    flags = [SESSION_RUNNER_FLAG] if sessions else []
    spec = sandbox_pod_spec(
        sandbox,
        settings,
        command=[*settings.pool_runner_command, *flags],
        config_name=config_name,
    )
    container = spec["containers"][0]
    container["ports"] = [
        {"name": RUNNER_PORT_NAME, "containerPort": RUNNER_PORT, "protocol": "TCP"}
    ]
    container["readinessProbe"] = {
        "httpGet": {"path": READY_PATH, "port": RUNNER_PORT_NAME},
        "periodSeconds": 1,
    }
    return spec


def build_pool_pod(
    *,
    namespace: str,
    pool_name: str,
    sandbox: Sandbox,
    configmap: Manifest,
    settings: OperatorSettings,
    sessions: bool = False,
) -> Manifest:
    """A free pod of the pool (sessions: its runner serves a whole session)."""
    spec = serve_pod_spec(
        sandbox, settings, sessions=sessions, config_name=configmap["metadata"]["name"]
    )
    labels = pool_labels(pool_name, template_hash(spec, configmap))
    metadata = {"generateName": f"{pool_name}-", "namespace": namespace, "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def build_session_configmap(
    *,
    namespace: str,
    session_name: str,
    uid: str,
    sandbox: Sandbox,
    settings: OperatorSettings,
    extra_env: Mapping[str, str] | None = None,
) -> Manifest:
    return build_serve_configmap(
        namespace=namespace,
        name=child_name(session_name, uid),
        labels={MANAGED_BY_LABEL: MANAGED_BY, SESSION_LABEL: session_name},
        sandbox=sandbox,
        settings=settings,
        extra_env=extra_env,
    )


def build_session_pod(
    configmap: Manifest, sandbox: Sandbox, settings: OperatorSettings
) -> Manifest:
    """A session's own serving pod (no pool had one free), named and labelled like its serve
    config (build_session_configmap)."""
    meta = configmap["metadata"]
    spec = serve_pod_spec(sandbox, settings, sessions=True, config_name=meta["name"])
    # A sandbox (the deny-all policy selects it) of this session.
    labels = sandbox_labels(meta["labels"][SESSION_LABEL], SESSION_LABEL)
    metadata = {"name": meta["name"], "namespace": meta["namespace"], "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def build_runner_ingress_policy(
    namespace: str,
    peers: list[dict[str, Any]],
    *,
    name: str = RUNNER_INGRESS_POLICY_NAME,
    selector_label: str = POOL_LABEL,
) -> Manifest | None:
    """Ingress to the runner port of every pod with `selector_label` (pool pods, or session
    pods), from `peers` only (the operator); None without peers (an empty `from` would admit
    everyone). Egress stays denied."""
    if not peers:
        return None
    spec = {
        "podSelector": {"matchExpressions": [{"key": selector_label, "operator": "Exists"}]},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [dict(peer) for peer in peers],
                "ports": [{"protocol": "TCP", "port": RUNNER_PORT}],
            }
        ],
    }
    return namespace_policy(namespace, name, spec)

"""Pure builders of what a SandboxPool needs: its pods, its serve-config ConfigMap, and the
namespace's NetworkPolicy that lets the operator (alone) reach the serving runners.

No I/O here. The pool controller adds ownerReferences (kopf.adopt) and creates these.
"""

import hashlib
import json
from typing import Any

from sandpod_contract.catalog import Catalog
from sandpod_contract.models import SandboxPoolSpec
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
    pool_runner_config_name,
)

from sandpod_operator.builders import (
    InvalidSpecError,
    Manifest,
    Sandbox,
    catalog_language,
    language_config,
    limits_within,
    namespace_policy,
    sandbox_pod_spec,
)
from sandpod_operator.settings import CONFIG_KEY, OperatorSettings

RUNNER_INGRESS_POLICY_NAME = "sandpod-runner-ingress"
READY_PATH = "/ready"
TEMPLATE_HASH_CHARS = 16


def plan_pool(spec: SandboxPoolSpec, catalog: Catalog, settings: OperatorSettings) -> Sandbox:
    """The pool's sandbox, or InvalidSpecError naming the field (unknown language, limits
    above the installation's maximums, a compiled language). Pool pods run the default
    RuntimeClass."""
    language = catalog_language(spec.language, catalog)
    if language.compile_command is not None:
        # A pre-started program cannot wait for a build of a source it has not seen yet.
        raise InvalidSpecError(
            f"spec.language: {spec.language} is compiled before it runs; pools serve "
            "languages without a compile step"
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


def build_pool_configmap(
    *, namespace: str, pool_name: str, sandbox: Sandbox, settings: OperatorSettings
) -> Manifest:
    """The serve config: what config.json holds for every execution of this language (the
    per-execution fields come with each request)."""
    config = language_config(sandbox.language, settings)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": pool_runner_config_name(pool_name),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, POOL_LABEL: pool_name},
        },
        "data": {CONFIG_KEY: json.dumps(config, indent=2) + "\n"},
    }


def template_hash(pod_spec: Manifest, configmap: Manifest) -> str:
    """Identifies what a pool pod is made of: a pod whose label differs is out of date."""
    text = json.dumps([pod_spec, configmap["data"]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:TEMPLATE_HASH_CHARS]


def build_pool_pod(
    *,
    namespace: str,
    pool_name: str,
    sandbox: Sandbox,
    configmap: Manifest,
    settings: OperatorSettings,
) -> Manifest:
    """A hardened sandbox pod whose runner serves one execution: no deadline of its own (the
    operator enforces each execution's), ready once the runner is."""
    spec = sandbox_pod_spec(
        sandbox,
        settings,
        command=settings.pool_runner_command,
        config_name=configmap["metadata"]["name"],
    )
    container = spec["containers"][0]
    container["ports"] = [
        {"name": RUNNER_PORT_NAME, "containerPort": RUNNER_PORT, "protocol": "TCP"}
    ]
    container["readinessProbe"] = {
        "httpGet": {"path": READY_PATH, "port": RUNNER_PORT_NAME},
        "periodSeconds": 1,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{pool_name}-",
            "namespace": namespace,
            "labels": pool_labels(pool_name, template_hash(spec, configmap)),
        },
        "spec": spec,
    }


def build_runner_ingress_policy(namespace: str, peers: list[dict[str, Any]]) -> Manifest | None:
    """Ingress to the runner port of every pool pod, from `peers` only (the operator); None
    without peers (an empty `from` would admit everyone). Egress stays denied."""
    if not peers:
        return None
    spec = {
        "podSelector": {"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [dict(peer) for peer in peers],
                "ports": [{"protocol": "TCP", "port": RUNNER_PORT}],
            }
        ],
    }
    return namespace_policy(namespace, RUNNER_INGRESS_POLICY_NAME, spec)

"""The Helm chart (charts/sandpod), rendered with `helm template`: lint, the Kubernetes
schemas (kubernetes-validate, strict), values.schema.json, and what each value does."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic_settings import BaseSettings
from sandpod_contract import crd
from sandpod_contract.catalog import DEFAULT_CATALOG_PATH, load_catalog
from sandpod_contract.models import SandboxPoolSpec
from sandpod_contract.names import (
    FINISHED_LABEL,
    GROUP,
    PLURAL,
    QUEUED_LABEL,
    ROLE_LABEL,
    RUNNER_PORT,
    SANDBOX_ROLE,
    SESSION_PLURAL,
    TENANT_LABEL,
)
from sandpod_gateway.policy.auth import KeyIndex, parse_tenants_config
from sandpod_gateway.settings import GatewaySettings
from sandpod_operator.egress.policy import (
    CLUSTER_NETWORK,
    PUBLIC_ONLY,
    RULE_REASONS,
    make_bounds,
)
from sandpod_operator.settings import OperatorSettings
from sandpod_testkit.paths import REPO_ROOT

CHART = REPO_ROOT / "charts" / "sandpod"
KUBERNETES_VERSION = "1.34.0"
RELEASE = "sp"
NAMESPACE = "sandpod-system"
FULLNAME = f"{RELEASE}-sandpod"

Manifest = dict[str, Any]

# Settings the chart sets itself (from other values) rather than through `config`.
CHART_MANAGED_OPERATOR_SETTINGS = {
    "catalog_path",
    "runtime_class_name",
    "metrics_port",
    "runner_ingress_from",
    "egress_open_cidrs",
    "egress_node_cidrs",
    "egress_pod_cidrs",
    "egress_service_cidrs",
    "egress_api_server_cidrs",
    "egress_namespace_cidrs",
    "egress_namespace_hosts",
    "namespace_max_stored_bytes",
    "egress_proxy_service",
    "egress_proxy_port",
    "egress_proxy_monitor_port",
    "egress_proxy_pod_labels",
    "egress_proxy_key_file",
    "direct_port",
    "direct_token_file",
}
CHART_MANAGED_GATEWAY_SETTINGS = {
    "kubeconfig",
    "catalog_path",
    "api_keys_secret",
    "api_keys_namespace",
    "direct_service",
    "direct_url",
    "direct_token_file",
    "replicas",
}
# A value other than the default for every operator and gateway setting.
EVERY_OPERATOR_SETTING: dict[str, Any] = {
    "allowedRuntimeClasses": ["gvisor-kvm"],
    "defaultCpu": "250m",
    "maxCpu": "1",
    "cpuRequest": "20m",
    "defaultMemory": "128Mi",
    "maxMemory": "1Gi",
    "defaultEphemeralStorage": "128Mi",
    "maxEphemeralStorage": "512Mi",
    "ephemeralStorageRequest": "8Mi",
    "tmpSizeLimit": "64Mi",
    "maxTimeoutSeconds": 120,
    "compileTimeoutSeconds": 45,
    "defaultTtlSeconds": 600,
    "statusOutputBytes": 32768,
    "maxDiagnostics": 50,
    "maxOutputFiles": 32,
    "maxOutputFilesBytes": 4194304,
    "outputsStoredBytes": 524288,
    "logReadLimitBytes": 104857600,
    "sandboxUid": 10001,
    "sandboxGid": 10002,
    "processLimit": 64,
    "fileSizeLimitBytes": 52428800,
    "openFilesLimit": 256,
    "podStartupTimeoutSeconds": 90,
    "queueTimeoutSeconds": 120,
    "deadlineGraceSeconds": 2.5,
    "watchdogIntervalSeconds": 1.5,
    "resyncAfterSeconds": 45,
    "stalledAfterSeconds": 90,
    "sessionQueueLimit": 8,
    "recordsKeptPerNamespace": 500,
    "admissionHoldSeconds": 7.5,
    "recordsSweepSeconds": 15.5,
    "poolRunnerCommand": ["/opt/sandpod/bin/sandpod-runner", "--serve", "/etc/serve.json"],
    "poolResyncSeconds": 10.5,
    "poolRunsPerSandbox": 50,
    "poolSandboxMaxAgeSeconds": 600,
    "poolWaitSeconds": 1.5,
    "sandboxMemoryOverhead": "96Mi",
}
EVERY_GATEWAY_SETTING: dict[str, Any] = {
    "apiKeysRefreshSeconds": 10,
    "defaultTimeoutSeconds": 20,
    "defaultMemory": "128Mi",
    "defaultCpu": "250m",
    "ttlSecondsAfterFinished": 600,
    "waitMarginSeconds": 60.5,
    "maxCodeBytes": 131072,
    "maxRequestBytes": 524288,
    "defaultRetryAfterSeconds": 3,
    "maxLogFollows": 50,
    "maxLogFollowBytes": 1048576,
    "mcpAllowedHosts": ["sandpod.example"],
    "judge0CallbackHosts": ["lms.example", "grader.example:8443"],
    "judge0QueueSize": 40,
    "judge0MaxBatchSize": 50,
    "maxUploadParts": 16,
}
CI_KEY_DIGEST = hashlib.sha256(b"sk-ci-a").hexdigest()
CI_B_KEY_DIGEST = hashlib.sha256(b"sk-ci-b").hexdigest()
TEST_KEY_SECRET = f"{FULLNAME}-test-api-key"
# Keys as a platform team gives them: digests only, no plaintext in the values.
HASHED_TENANTS: list[dict[str, Any]] = [
    {"name": "team-a", "apiKeys": [{"name": "ci", "sha256": CI_KEY_DIGEST}]},
    {"name": "team-b", "apiKeys": [{"name": "ci-b", "sha256": CI_B_KEY_DIGEST}]},
]

TENANTS: list[dict[str, Any]] = [
    {
        "name": "team-a",
        "apiKeys": [{"name": "ci", "sha256": CI_KEY_DIGEST}, {"name": "dev", "key": "sk-dev-a"}],
        "limits": {
            "maxTimeoutSeconds": 30,
            "maxMemory": "1Gi",
            "maxCpu": "2",
            "maxConcurrent": 3,
            "maxOpenWaits": 10,
            "maxWaitsPerExecution": 2,
            "maxSessions": 2,
            "maxIdleTimeoutSeconds": 300,
            "maxLifetimeSeconds": 600,
            "maxFileBytes": 65536,
            "maxInlineFileBytes": 262144,
            "maxStoredBytes": 64 * 1024 * 1024,
            "requestsPerSecond": 20,
            "requestBurst": 40,
        },
        "resourceQuota": {"pods": "20"},
        "pools": [
            {"name": "py", "language": "python", "size": 4},
            {
                "name": "big",
                "language": "bash",
                "resources": {"cpu": "1", "memory": "512Mi", "ephemeralStorage": "128Mi"},
                "size": 1,
                "maxRefillPerMinute": 10,
                "runsPerSandbox": 1,
                "sandboxMaxAgeSeconds": 600,
            },
        ],
        "egress": {"allowedCidrs": ["1.1.1.0/24", "203.0.113.0/24"]},
    },
    {
        "name": "team-b",
        "namespace": "shared",
        "apiKeys": [{"key": "sk-dev-b"}],
        "egress": {"allowedCidrs": ["1.1.1.0/24"]},
        "lint": {"select": ["E", "F"], "ignore": ["E501"]},
    },
    # Without egress: the namespace it shares with team-b is not narrowed.
    {"name": "team-c", "namespace": "shared", "createNamespace": False},
    {
        "name": "team-d",
        "namespace": "existing",
        "createNamespace": False,
        "egress": {"allowedCidrs": []},
    },
]
EGRESS_VALUES: dict[str, Any] = {
    "nodeCidrs": ["192.0.2.10/32"],
    "podCidrs": ["10.244.0.0/16"],
    "serviceCidrs": ["10.96.0.0/12"],
    "apiServerCidrs": ["192.0.2.1/32"],
    "openCidrs": ["203.0.113.0/24"],
    "admissionPolicy": True,
}

# Every value away from its default, where the chart has a choice to make.
FULL_VALUES: dict[str, Any] = {
    "images": {
        "registry": "registry.example/platform/sandpod",
        "tag": "1.2.3",
        "pullPolicy": "Always",
        "pullSecrets": [{"name": "regcred"}],
    },
    "crds": {"enabled": True, "keep": False},
    "runtimeClass": {
        "create": True,
        "name": "gvisor",
        "handler": "runsc",
        "overhead": {"podFixed": {"cpu": "50m", "memory": "32Mi"}},
        "scheduling": {"nodeSelector": {"sandpod.dev/gvisor": "true"}},
    },
    "catalog": {
        "languages": {
            "python": {
                "image": "python",
                "file": "main.py",
                "command": ["python3", "main.py"],
                "env": {"PYTHONUNBUFFERED": "1"},
            },
            "bash": {
                "image": "registry.other/tools/bash:5.2",
                "file": "main.sh",
                "command": ["bash", "main.sh"],
            },
        }
    },
    "tenants": TENANTS,
    "egress": EGRESS_VALUES,
    "tenantNamespaces": {"labels": {"team": "platform"}, "annotations": {"owner": "platform"}},
    "operator": {
        "image": {"name": "operator", "tag": "1.2.4"},
        "watchNamespaces": ["team-a", "shared"],
        "logLevel": "debug",
        "logFormat": "json",
        "healthPort": 8081,
        "metricsPort": 0,
        "config": EVERY_OPERATOR_SETTING,
        "podAnnotations": {"example.com/scrape": "false"},
        "podLabels": {"team": "platform"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                            ]
                        }
                    ]
                }
            }
        },
        "priorityClassName": "system-cluster-critical",
    },
    "gateway": {
        "replicas": 3,
        "port": 9000,
        "service": {"type": "LoadBalancer", "port": 443, "annotations": {"example.com/lb": "x"}},
        "config": EVERY_GATEWAY_SETTING,
        "resources": {"requests": {"cpu": "200m"}},
    },
    "networkPolicies": {
        "ingressFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}}
        ],
        "apiServerEgress": {"enabled": True, "cidrs": ["192.0.2.2/32"], "ports": [6443]},
    },
    "uninstallHook": {"timeoutSeconds": 300},
    "test": {
        "apiKey": "sk-dev-b",
        "language": "bash",
        "code": "echo hi",
        "expectedStdout": "hi\n",
        "timeoutSeconds": 20,
    },
}
MINIMAL_VALUES: dict[str, Any] = {
    "crds": {"enabled": False},
    "egress": {"admissionPolicy": False},
    "gateway": {"enabled": False},
    "egressProxy": {"enabled": False},
    "networkPolicies": {"enabled": False, "sandboxDenyAll": False},
    "uninstallHook": {"enabled": False},
    "test": {"enabled": False},
    "labelPolicy": {"enabled": False},
    "tenantNamespaces": {"objectQuota": {"enabled": False}},
    "tenants": [{"name": "solo"}],
}
SCENARIOS = {"default": {}, "full": FULL_VALUES, "minimal": MINIMAL_VALUES}


def helm_template(
    helm: Path, tmp_path: Path, values: dict[str, Any], *args: str
) -> subprocess.CompletedProcess[str]:
    values_file = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    command = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    command += ["--kube-version", KUBERNETES_VERSION, "--values", str(values_file), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def render(helm: Path, tmp_path: Path, values: dict[str, Any]) -> list[Manifest]:
    completed = helm_template(helm, tmp_path, values)
    assert completed.returncode == 0, completed.stderr
    return [document for document in yaml.safe_load_all(completed.stdout) if document]


def find(manifests: list[Manifest], kind: str, name: str, namespace: str | None = None) -> Manifest:
    for manifest in manifests:
        metadata = manifest["metadata"]
        if (manifest["kind"], metadata["name"]) == (kind, name) and namespace in (
            None,
            metadata.get("namespace"),
        ):
            return manifest
    raise AssertionError(f"no {kind} {namespace}/{name} among {names(manifests)}")


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [manifest for manifest in manifests if manifest["kind"] == kind]


def names(manifests: list[Manifest]) -> list[str]:
    return [
        f"{m['kind']} {m['metadata'].get('namespace', '')}/{m['metadata']['name']}"
        for m in manifests
    ]


def pod_specs(manifests: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    for manifest in manifests:
        if manifest["kind"] == "Pod":
            yield manifest["metadata"]["name"], manifest["spec"]
        elif manifest["kind"] in ("Deployment", "Job"):
            yield manifest["metadata"]["name"], manifest["spec"]["template"]["spec"]


def container_env(pod_spec: Manifest) -> dict[str, Any]:
    return {
        variable["name"]: variable.get("value", variable.get("valueFrom"))
        for variable in pod_spec["containers"][0].get("env", [])
    }


def camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.capitalize() for part in rest)


@pytest.fixture(scope="module")
def rendered(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Manifest]]:
    workdir = tmp_path_factory.mktemp("chart")
    return {name: render(helm, workdir, values) for name, values in SCENARIOS.items()}


@pytest.fixture(scope="module")
def values_schema() -> dict[str, Any]:
    return dict(json.loads((CHART / "values.schema.json").read_text()))


# --- lint and the Kubernetes schemas ---


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict(helm: Path, tmp_path: Path, scenario: str) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(SCENARIOS[scenario]))
    completed = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART), "--values", str(values_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_manifests_match_the_kubernetes_schemas(
    rendered: dict[str, list[Manifest]], scenario: str
) -> None:
    manifests = rendered[scenario]
    assert manifests
    for manifest in manifests:
        if manifest["kind"] == "SandboxPool":  # ours: the model the CRD is generated from
            SandboxPoolSpec.model_validate(manifest["spec"])
            continue
        # Strict: an unknown or misplaced field is an error too. A kind without a schema raises.
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_the_validator_catches_mistakes(rendered: dict[str, list[Manifest]]) -> None:
    deployment = copy.deepcopy(find(rendered["default"], "Deployment", f"{FULLNAME}-operator"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_every_object_names_its_release(rendered: dict[str, list[Manifest]]) -> None:
    for scenario, manifests in rendered.items():
        for manifest in manifests:
            labels = manifest["metadata"].get("labels", {})
            assert labels.get("app.kubernetes.io/instance") == RELEASE or (
                manifest["kind"] == "CustomResourceDefinition"
            ), f"{scenario}: {names([manifest])}"


# --- the CRD: one source of truth ---


def test_crd_template_is_the_crds_file(rendered: dict[str, list[Manifest]]) -> None:
    for kind in crd.KINDS:
        committed = yaml.safe_load((REPO_ROOT / "crds" / f"{kind.crd_name}.yaml").read_text())
        installed = find(rendered["default"], "CustomResourceDefinition", kind.crd_name)
        assert installed["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
        assert installed == committed
    not_kept = find(rendered["full"], "CustomResourceDefinition", crd.CRD_NAME)
    assert "annotations" not in not_kept["metadata"]
    assert not of_kind(rendered["minimal"], "CustomResourceDefinition")


# --- images and the catalog ---


def test_app_version_is_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_default_catalog_is_the_operators(
    rendered: dict[str, list[Manifest]], tmp_path: Path
) -> None:
    configmap = find(rendered["default"], "ConfigMap", f"{FULLNAME}-catalog", NAMESPACE)
    text = configmap["data"]["catalog.yaml"]
    assert yaml.safe_load(text) == yaml.safe_load(DEFAULT_CATALOG_PATH.read_text())
    (tmp_path / "catalog.yaml").write_text(text)
    assert load_catalog(tmp_path / "catalog.yaml") == load_catalog(DEFAULT_CATALOG_PATH)


def test_images_come_from_the_configured_registry(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["full"]
    registry = "registry.example/platform/sandpod"
    images = {name: spec["containers"][0]["image"] for name, spec in pod_specs(manifests)}
    assert images == {
        f"{FULLNAME}-operator": f"{registry}/operator:1.2.4",
        f"{FULLNAME}-gateway": f"{registry}/gateway:1.2.3",
        f"{FULLNAME}-uninstall": f"{registry}/operator:1.2.4",
        f"{FULLNAME}-test": f"{registry}/gateway:1.2.3",
        f"{FULLNAME}-egress-proxy": f"{registry}/egress-proxy:1.2.3",
    }
    catalog = yaml.safe_load(
        find(manifests, "ConfigMap", f"{FULLNAME}-catalog")["data"]["catalog.yaml"]
    )
    assert catalog["languages"]["python"]["image"] == f"{registry}/python:1.2.3"
    assert catalog["languages"]["bash"]["image"] == "registry.other/tools/bash:5.2"
    for name, spec in pod_specs(manifests):
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], name
        assert spec["containers"][0]["imagePullPolicy"] == "Always", name
    default_images = {spec["containers"][0]["image"] for _, spec in pod_specs(rendered["default"])}
    assert default_images == {
        "localhost/sandpod/operator:0.1.0",
        "localhost/sandpod/gateway:0.1.0",
        "localhost/sandpod/egress-proxy:0.1.0",
    }


def test_catalog_change_rolls_the_pods(helm: Path, tmp_path: Path) -> None:
    def checksums(values: dict[str, Any]) -> set[str]:
        manifests = render(helm, tmp_path, values)
        annotations = [
            deployment["spec"]["template"]["metadata"]["annotations"]
            for deployment in of_kind(manifests, "Deployment")
        ]
        return {a["checksum/catalog"] for a in annotations if "checksum/catalog" in a}

    before = checksums({})
    after = checksums({"images": {"registry": "registry.example/sandpod"}})
    assert len(before) == len(after) == 1
    assert before != after


# --- tenants, keys, namespaces ---


def test_api_keys_secret_holds_digests_only(rendered: dict[str, list[Manifest]]) -> None:
    secret = find(rendered["full"], "Secret", f"{FULLNAME}-api-keys", NAMESPACE)
    text = base64.b64decode(secret["data"]["tenants.yaml"]).decode()
    assert "sk-dev" not in text
    config = parse_tenants_config(text)
    team_a = config.tenants["team-a"]
    assert team_a.namespace == "team-a"
    assert [key.sha256 for key in team_a.api_keys] == [
        CI_KEY_DIGEST,
        hashlib.sha256(b"sk-dev-a").hexdigest(),
    ]
    assert team_a.limits.model_dump(by_alias=True) == TENANTS[0]["limits"]
    assert config.tenants["team-c"].namespace == "shared"
    assert team_a.lint is None
    lint = config.tenants["team-b"].lint
    assert lint is not None and (lint.select, lint.ignore) == (["E", "F"], ["E501"])
    index = KeyIndex(config)
    for key, tenant in [("sk-ci-a", "team-a"), ("sk-dev-a", "team-a"), ("sk-dev-b", "team-b")]:
        resolved = index.resolve(key)
        assert resolved is not None and resolved.name == tenant
    assert index.resolve("sk-unknown") is None
    empty = find(rendered["default"], "Secret", f"{FULLNAME}-api-keys", NAMESPACE)
    empty_text = base64.b64decode(empty["data"]["tenants.yaml"]).decode()
    assert parse_tenants_config(empty_text).tenants == {}


def test_a_tenants_lint_rules_must_be_rule_codes(helm: Path, tmp_path: Path) -> None:
    tenant = {"name": "t", "lint": {"select": ["--config=x.toml"]}}
    completed = helm_template(helm, tmp_path, {"tenants": [tenant]})
    assert completed.returncode != 0
    assert "lint" in completed.stderr


def test_existing_keys_secret_is_used_instead(helm: Path, tmp_path: Path) -> None:
    values = {"apiKeys": {"existingSecret": "from-vault"}, "tenants": HASHED_TENANTS}
    manifests = render(helm, tmp_path, values)
    # No keys of the chart's own: it cannot add the test key to a Secret it does not render.
    assert [secret["metadata"]["name"] for secret in of_kind(manifests, "Secret")] == [
        f"{FULLNAME}-direct-token",
        f"{FULLNAME}-egress-proxy-key",
    ]
    gateway = find(manifests, "Deployment", f"{FULLNAME}-gateway")["spec"]["template"]["spec"]
    assert container_env(gateway)["SANDPOD_GATEWAY_API_KEYS_SECRET"] == "from-vault"
    role = find(manifests, "Role", f"{FULLNAME}-gateway-api-keys", NAMESPACE)
    assert role["rules"][0]["resourceNames"] == ["from-vault"]


def test_tenant_namespaces(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["full"]
    created = {ns["metadata"]["name"]: ns for ns in of_kind(manifests, "Namespace")}
    assert set(created) == {"team-a", "shared"}
    labels = created["shared"]["metadata"]["labels"]
    # The chart's own labels are kept along with the configured ones.
    assert labels["team"] == "platform"
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert created["shared"]["metadata"]["annotations"] == {"owner": "platform"}
    served = {"team-a", "shared", "existing"}
    gateway_bindings = bindings_of(manifests, f"{NAMESPACE}-{FULLNAME}-gateway-tenant")
    assert {b["metadata"]["namespace"] for b in gateway_bindings} == served
    assert {b["metadata"]["name"] for b in gateway_bindings} == {f"{FULLNAME}-gateway-tenant"}
    deny_all = [
        policy
        for policy in of_kind(manifests, "NetworkPolicy")
        if policy["metadata"]["name"] == f"{FULLNAME}-sandbox-deny-all"
    ]
    assert {policy["metadata"]["namespace"] for policy in deny_all} == served
    for policy in deny_all:
        assert policy["spec"] == {
            "podSelector": {"matchLabels": {ROLE_LABEL: SANDBOX_ROLE}},
            "policyTypes": ["Ingress", "Egress"],
        }
    pools = {pool["metadata"]["name"]: pool for pool in of_kind(manifests, "SandboxPool")}
    assert set(pools) == {"py", "big"}
    assert pools["py"]["metadata"]["namespace"] == "team-a"
    assert pools["py"]["spec"] == {"language": "python", "size": 4}
    assert pools["big"]["spec"]["resources"]["memory"] == "512Mi"
    assert pools["big"]["spec"]["maxRefillPerMinute"] == 10
    # Hooks: the CRD of the same release must exist before Helm can map a SandboxPool.
    assert pools["py"]["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    quota = find(manifests, "ResourceQuota", "sandpod-tenant-team-a", "team-a")
    assert quota["spec"] == {"hard": {"pods": "20"}}
    tenant_quotas = of_kind(manifests, "ResourceQuota")
    assert [q for q in tenant_quotas if q["metadata"]["name"] != "sandpod-objects"] == [quota]
    default_labels = find(rendered["minimal"], "Namespace", "solo")["metadata"]["labels"]
    assert default_labels["pod-security.kubernetes.io/enforce"] == "restricted"


OBJECT_COUNTS = {
    f"count/{PLURAL}.{GROUP}": "5000",
    f"count/{SESSION_PLURAL}.{GROUP}": "100",
}


def test_every_tenant_namespace_has_an_object_quota(rendered: dict[str, list[Manifest]]) -> None:
    quotas = [
        q
        for q in of_kind(rendered["full"], "ResourceQuota")
        if q["metadata"]["name"] == "sandpod-objects"
    ]
    # Once per namespace, those the chart creates and those it is given (existing).
    assert sorted(q["metadata"]["namespace"] for q in quotas) == ["existing", "shared", "team-a"]
    for quota in quotas:
        assert quota["spec"] == {"hard": OBJECT_COUNTS}
        assert quota["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert of_kind(rendered["default"], "ResourceQuota") == []  # no tenants, no namespaces
    assert of_kind(rendered["minimal"], "ResourceQuota") == []  # turned off


def test_the_object_quota_can_be_changed_or_turned_off(helm: Path, tmp_path: Path) -> None:
    tenants = {"tenants": [{"name": "solo"}]}
    smaller = {f"count/{PLURAL}.{GROUP}": "50", "count/configmaps": "60"}
    changed = render(
        helm, tmp_path, {**tenants, "tenantNamespaces": {"objectQuota": {"hard": smaller}}}
    )
    off = render(
        helm, tmp_path, {**tenants, "tenantNamespaces": {"objectQuota": {"enabled": False}}}
    )

    # Helm merges maps: a value given replaces the default's, the other defaults stay.
    quota = find(changed, "ResourceQuota", "sandpod-objects", "solo")
    assert quota["spec"]["hard"] == {**OBJECT_COUNTS, **smaller}
    assert of_kind(off, "ResourceQuota") == []


def test_the_gateway_knows_its_replica_count(rendered: dict[str, list[Manifest]]) -> None:
    for scenario, replicas in [("default", "2"), ("full", "3")]:
        deployment = find(rendered[scenario], "Deployment", f"{FULLNAME}-gateway", NAMESPACE)
        env = container_env(deployment["spec"]["template"]["spec"])
        assert env["SANDPOD_GATEWAY_REPLICAS"] == replicas


# --- the operator ---


def test_operator_deployment(rendered: dict[str, list[Manifest]]) -> None:
    deployment = find(rendered["default"], "Deployment", f"{FULLNAME}-operator", NAMESPACE)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "kopf",
        "run",
        "--module=sandpod_operator.handlers",
        "--standalone",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--log-format=full",
        "--all-namespaces",
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "metrics", "containerPort": 9090} in container["ports"]
    env = container_env(deployment["spec"]["template"]["spec"])
    assert env["SANDPOD_CATALOG_PATH"] == "/etc/sandpod/catalog.yaml"
    assert env["SANDPOD_RUNTIME_CLASS_NAME"] == "gvisor"
    full = find(rendered["full"], "Deployment", f"{FULLNAME}-operator")["spec"]["template"]
    command = full["spec"]["containers"][0]["command"]
    assert command[-5:] == [
        "--liveness=http://0.0.0.0:8081/healthz",
        "--log-format=json",
        "--debug",
        "--namespace=team-a",
        "--namespace=shared",
    ]
    assert full["metadata"]["annotations"]["example.com/scrape"] == "false"
    assert full["metadata"]["labels"]["team"] == "platform"
    assert full["spec"]["priorityClassName"] == "system-cluster-critical"
    assert full["spec"]["tolerations"][0]["key"] == "dedicated"
    assert "metrics" not in {port["name"] for port in full["spec"]["containers"][0]["ports"]}


def role_rules(manifests: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    for manifest in manifests:
        if manifest["kind"] in ("Role", "ClusterRole"):
            for rule in manifest["rules"]:
                yield manifest["metadata"]["name"], rule


def test_rbac_is_least_privilege(rendered: dict[str, list[Manifest]]) -> None:
    for scenario, manifests in rendered.items():
        for name, rule in role_rules(manifests):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{scenario}: {name} grants * {field}"
            assert "secrets" not in rule["resources"] or rule.get("resourceNames"), name
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), name
    operator_role = find(rendered["default"], "ClusterRole", f"{NAMESPACE}-{FULLNAME}-operator")
    granted = {
        resource: set(rule["verbs"])
        for rule in operator_role["rules"]
        for resource in rule["resources"]
    }
    assert set(granted) == {
        "codeexecutions",
        "codeexecutions/status",
        "codeexecutions/finalizers",
        "sandboxpools",
        "sandboxpools/status",
        "sandboxpools/finalizers",
        "codesessions",
        "codesessions/status",
        "codesessions/finalizers",
        "pods",
        "pods/log",
        "configmaps",
        "networkpolicies",
        "events",
    }
    assert granted["pods/log"] == {"get"}
    assert granted["configmaps"] == {"get", "create", "patch"}  # never list: only its own children
    assert granted["pods"] == {"get", "list", "watch", "create", "patch", "delete"}
    assert granted["sandboxpools/status"] == {"get", "patch"}


def bindings_of(manifests: list[Manifest], role: str) -> list[Manifest]:
    return [
        m
        for m in manifests
        if m["kind"] in ("RoleBinding", "ClusterRoleBinding") and m["roleRef"]["name"] == role
    ]


def test_operator_rbac_follows_its_scope(rendered: dict[str, list[Manifest]]) -> None:
    role = f"{NAMESPACE}-{FULLNAME}-operator"
    everywhere = bindings_of(rendered["default"], role)
    assert [b["kind"] for b in everywhere] == ["ClusterRoleBinding"]
    scoped = bindings_of(rendered["full"], role)
    assert {(b["kind"], b["metadata"]["namespace"]) for b in scoped} == {
        ("RoleBinding", "team-a"),
        ("RoleBinding", "shared"),
    }
    for scenario in ("default", "full"):
        (cluster,) = bindings_of(rendered[scenario], f"{role}-cluster")
        assert cluster["subjects"] == [
            {"kind": "ServiceAccount", "name": f"{FULLNAME}-operator", "namespace": NAMESPACE}
        ]


def settings_from_env(env: dict[str, str], model: str) -> dict[str, Any]:
    """The settings a component builds from this environment (in a clean child process)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDPOD_")}
    module, name = model.rsplit(".", 1)
    program = f"from {module} import {name}; print({name}().model_dump_json())"
    completed = subprocess.run(
        [sys.executable, "-c", program],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    return dict(json.loads(completed.stdout))


def settings_reaching(
    rendered: dict[str, list[Manifest]],
    component: str,
    model: type[BaseSettings],
    chart_managed: set[str],
    every: dict[str, Any],
) -> dict[str, Any]:
    """The settings the full values give `component`'s Deployment, once each of the model's
    settings (but those the chart manages) is checked to arrive as `every` sets it."""
    expected = set(model.model_fields) - chart_managed
    assert {camel(name) for name in expected} == set(every)
    deployment = find(rendered["full"], "Deployment", f"{FULLNAME}-{component}")
    spec = deployment["spec"]["template"]["spec"]
    settings = settings_from_env(container_env(spec), f"{model.__module__}.{model.__name__}")
    for name in expected:
        assert settings[name] == every[camel(name)], name
    return settings


def test_every_setting_reaches_the_operator(rendered: dict[str, list[Manifest]]) -> None:
    settings = settings_reaching(
        rendered,
        "operator",
        OperatorSettings,
        CHART_MANAGED_OPERATOR_SETTINGS,
        EVERY_OPERATOR_SETTING,
    )
    assert settings["metrics_port"] == 0
    assert settings["catalog_path"] == "/etc/sandpod/catalog.yaml"
    # Each tenant namespace's stored bytes: the largest its tenants set, else the default.
    assert settings["namespace_max_stored_bytes"]["team-a"] == 64 * 1024 * 1024
    assert settings["namespace_max_stored_bytes"]["shared"] is None
    # Pool pods' runners accept connections from the operator's pods alone.
    assert settings["runner_ingress_from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/component": "operator",
                    "app.kubernetes.io/instance": RELEASE,
                    "app.kubernetes.io/name": "sandpod",
                }
            },
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
        }
    ]


def test_every_setting_reaches_the_gateway(rendered: dict[str, list[Manifest]]) -> None:
    settings = settings_reaching(
        rendered, "gateway", GatewaySettings, CHART_MANAGED_GATEWAY_SETTINGS, EVERY_GATEWAY_SETTING
    )
    assert settings["api_keys_namespace"] == NAMESPACE
    assert settings["api_keys_secret"] == f"{FULLNAME}-api-keys"
    assert settings["replicas"] == 3


# --- the gateway ---


def test_gateway_deployment_and_service(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["full"]
    deployment = find(manifests, "Deployment", f"{FULLNAME}-gateway", NAMESPACE)
    assert deployment["spec"]["replicas"] == 3
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--port=9000" in container["command"]
    assert container["ports"] == [{"name": "http", "containerPort": 9000}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = find(manifests, "Service", f"{FULLNAME}-gateway", NAMESPACE)
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 443, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_without_the_gateway(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["minimal"]
    kinds = {m["kind"] for m in manifests}
    assert kinds == {
        "Namespace",
        "ConfigMap",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    }
    assert [d["metadata"]["name"] for d in of_kind(manifests, "Deployment")] == [
        f"{FULLNAME}-operator"
    ]


def test_only_the_gateway_and_the_operator_set_the_counted_labels(
    rendered: dict[str, list[Manifest]],
) -> None:
    policy = find(
        rendered["default"], "ValidatingAdmissionPolicy", f"{NAMESPACE}-{FULLNAME}-labels"
    )
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    # Both kinds are counted per tenant by these labels.
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == [PLURAL, SESSION_PLURAL]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert f"'{TENANT_LABEL}' in object.metadata.labels" in variables["tenant"]
    assert f"'{FINISHED_LABEL}' in object.metadata.labels" in variables["finished"]
    assert '["system:masters"]' in variables["trusted"]
    tenant_rule, finished_rule, queued_rule = (v["expression"] for v in spec["validations"])
    account = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}"
    assert f"== '{account}-gateway'" in tenant_rule
    # The operator sets it only on the records of the direct path it creates.
    assert tenant_rule.endswith(
        f"(request.userInfo.username == '{account}-operator' && oldObject == null"
        " && variables.record == 'direct')"
    )
    assert finished_rule.endswith(f"== '{account}-operator'")
    # The gateway queues an execution as it creates it; the operator alone lets it go.
    assert f"'{QUEUED_LABEL}' in object.metadata.labels" in variables["queued"]
    assert queued_rule.endswith(
        f"(request.userInfo.username == '{account}-gateway' && oldObject == null)"
        f" || (request.userInfo.username == '{account}-operator' && variables.queued == '')"
    )
    for manifests in (rendered["default"], rendered["full"]):
        accounts = {a["metadata"]["name"] for a in of_kind(manifests, "ServiceAccount")}
        assert {f"{FULLNAME}-gateway", f"{FULLNAME}-operator"} <= accounts
    binding = find(
        rendered["default"], "ValidatingAdmissionPolicyBinding", f"{NAMESPACE}-{FULLNAME}-labels"
    )
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace
    assert not of_kind(rendered["minimal"], "ValidatingAdmissionPolicy")


def test_the_label_policy_binds_to_the_served_namespaces(helm: Path, tmp_path: Path) -> None:
    values = {"operator": {"watchNamespaces": ["team-a", "team-b"]}}
    manifests = render(helm, tmp_path, values)
    binding = of_kind(manifests, "ValidatingAdmissionPolicyBinding")[0]
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "In",
                    "values": ["team-a", "team-b"],
                }
            ]
        }
    }


def test_watched_namespace_patterns(helm: Path, tmp_path: Path) -> None:
    """Patterns in operator.watchNamespaces: kopf gets them as they are, RBAC is cluster-wide
    (the namespaces do not exist yet) and the admission policies match namespaces by name."""
    values = {"operator": {"watchNamespaces": ["team-a", "e2e12-*"]}}
    manifests = render(helm, tmp_path, values)
    operator = find(manifests, "Deployment", f"{FULLNAME}-operator")
    command = operator["spec"]["template"]["spec"]["containers"][0]["command"]
    assert [a for a in command if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=e2e12-*",
    ]
    for role in (f"{NAMESPACE}-{FULLNAME}-operator", f"{NAMESPACE}-{FULLNAME}-uninstall"):
        assert [b["kind"] for b in bindings_of(manifests, role)] == ["ClusterRoleBinding"]
    job = find(manifests, "Job", f"{FULLNAME}-uninstall", NAMESPACE)
    assert container_env(job["spec"]["template"]["spec"])["NAMESPACES"] == "team-a,e2e12-*"
    policies = of_kind(manifests, "ValidatingAdmissionPolicy")
    assert len(policies) == 2
    for policy in policies:
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == (
            '["^team-a$","^e2e12-.*$"].exists(p, request.namespace.matches(p))'
        )
    for binding in of_kind(manifests, "ValidatingAdmissionPolicyBinding"):
        assert "matchResources" not in binding["spec"]


# --- hardening and network policies ---


def test_pods_are_hardened(rendered: dict[str, list[Manifest]]) -> None:
    needs_token = {f"{FULLNAME}-operator", f"{FULLNAME}-gateway", f"{FULLNAME}-uninstall"}
    for scenario, manifests in rendered.items():
        for name, spec in pod_specs(manifests):
            assert spec["securityContext"]["runAsNonRoot"] is True, name
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert spec["automountServiceAccountToken"] is (name in needs_token), name
            assert spec["enableServiceLinks"] is False, name
            for container in spec["containers"]:
                context = container["securityContext"]
                assert context["readOnlyRootFilesystem"] is True, name
                assert context["allowPrivilegeEscalation"] is False, name
                assert context["capabilities"] == {"drop": ["ALL"]}, name
                assert "memory" in container["resources"]["limits"], name
        for account in of_kind(manifests, "ServiceAccount"):
            assert account["automountServiceAccountToken"] is False, scenario


def test_network_policies(rendered: dict[str, list[Manifest]]) -> None:
    gateway = find(rendered["default"], "NetworkPolicy", f"{FULLNAME}-gateway", NAMESPACE)
    assert gateway["spec"]["policyTypes"] == ["Ingress"]
    assert gateway["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": "http"}]}]
    operator = find(rendered["default"], "NetworkPolicy", f"{FULLNAME}-operator", NAMESPACE)
    from_gateway = {
        "ports": [{"protocol": "TCP", "port": "direct"}],
        "from": [{"podSelector": {"matchLabels": selector_labels("gateway")}}],
    }
    assert operator["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": "metrics"}]},
        from_gateway,
    ]

    egress = [
        {
            "to": [{"ipBlock": {"cidr": "192.0.2.2/32"}}],
            "ports": [{"protocol": "TCP", "port": 6443}],
        }
    ]
    gateway = find(rendered["full"], "NetworkPolicy", f"{FULLNAME}-gateway", NAMESPACE)
    assert gateway["spec"]["policyTypes"] == ["Ingress", "Egress"]
    to_operator = {
        "to": [{"podSelector": {"matchLabels": selector_labels("operator")}}],
        "ports": [{"protocol": "TCP", "port": 8081}],
    }
    assert gateway["spec"]["egress"] == [*egress, to_operator]
    peers = gateway["spec"]["ingress"][0]["from"]
    assert peers[0] == FULL_VALUES["networkPolicies"]["ingressFrom"][0]
    test_labels = find(rendered["full"], "Pod", f"{FULLNAME}-test")["metadata"]["labels"]
    assert peers[1]["podSelector"]["matchLabels"].items() <= test_labels.items()
    operator = find(rendered["full"], "NetworkPolicy", f"{FULLNAME}-operator", NAMESPACE)
    # Metrics off: in, the direct path from the gateway alone; out: the API server, the
    # runners of pool and session pods in any namespace, and the egress proxy's monitors.
    to_runners = {
        "to": [
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {ROLE_LABEL: SANDBOX_ROLE}}}
        ],
        "ports": [{"protocol": "TCP", "port": RUNNER_PORT}],
    }
    proxy_pods = {"app.kubernetes.io/component": "egress-proxy"}
    to_monitors = operator["spec"]["egress"][2]
    assert proxy_pods.items() <= to_monitors["to"][0]["podSelector"]["matchLabels"].items()
    assert to_monitors["ports"] == [{"protocol": "TCP", "port": 9180}]
    assert operator["spec"] == {
        "podSelector": operator["spec"]["podSelector"],
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [from_gateway],
        "egress": [*egress, to_runners, to_monitors],
    }
    assert not of_kind(rendered["minimal"], "NetworkPolicy")


def selector_labels(component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "sandpod",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": component,
    }


def test_the_direct_path(rendered: dict[str, list[Manifest]], helm: Path, tmp_path: Path) -> None:
    manifests = rendered["default"]
    token = find(manifests, "Secret", f"{FULLNAME}-direct-token", NAMESPACE)
    assert len(base64.b64decode(token["data"]["token"])) == 48
    service = find(manifests, "Service", f"{FULLNAME}-operator", NAMESPACE)
    assert service["spec"]["ports"] == [
        {"name": "direct", "port": 8081, "targetPort": "direct", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == selector_labels("operator")
    operator = find(manifests, "Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"]
    gateway = find(manifests, "Deployment", f"{FULLNAME}-gateway")["spec"]["template"]["spec"]
    operator_env, gateway_env = container_env(operator), container_env(gateway)
    assert operator_env["SANDPOD_DIRECT_PORT"] == "8081"
    assert gateway_env["SANDPOD_GATEWAY_DIRECT_SERVICE"] == f"{NAMESPACE}/{FULLNAME}-operator:8081"
    for spec, env in ((operator, operator_env), (gateway, gateway_env)):
        token_file = (
            env.get("SANDPOD_DIRECT_TOKEN_FILE") or env["SANDPOD_GATEWAY_DIRECT_TOKEN_FILE"]
        )
        volume = next(v for v in spec["volumes"] if v["name"] == "direct-token")
        mount = next(
            m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "direct-token"
        )
        assert volume["secret"]["secretName"] == f"{FULLNAME}-direct-token"
        assert token_file == f"{mount['mountPath']}/token"
    assert {"name": "direct", "containerPort": 8081} in operator["containers"][0]["ports"]

    off = render(helm, tmp_path, {"operator": {"directPort": 0}})
    off_names = {(m["kind"], m["metadata"]["name"]) for m in off}
    assert ("Secret", f"{FULLNAME}-direct-token") not in off_names
    assert ("Service", f"{FULLNAME}-operator") not in off_names
    off_operator = find(off, "Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"]
    off_gateway = find(off, "Deployment", f"{FULLNAME}-gateway")["spec"]["template"]["spec"]
    assert container_env(off_operator)["SANDPOD_DIRECT_PORT"] == "0"
    assert "SANDPOD_GATEWAY_DIRECT_SERVICE" not in container_env(off_gateway)


def test_runtime_class(rendered: dict[str, list[Manifest]]) -> None:
    runtime_class = find(rendered["full"], "RuntimeClass", "gvisor")
    assert runtime_class["handler"] == "runsc"
    assert runtime_class["overhead"] == {"podFixed": {"cpu": "50m", "memory": "32Mi"}}
    assert runtime_class["scheduling"] == {"nodeSelector": {"sandpod.dev/gvisor": "true"}}
    assert not of_kind(rendered["default"], "RuntimeClass")


# --- hooks: helm test and helm uninstall ---


def hook_of(manifest: Manifest) -> str:
    return str(manifest["metadata"].get("annotations", {}).get("helm.sh/hook", ""))


def test_helm_test_runs_one_execution(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["full"]
    pod = find(manifests, "Pod", f"{FULLNAME}-test", NAMESPACE)
    # test.apiKey given: a hook Secret with it, and no key of the chart's own.
    secret = find(manifests, "Secret", f"{FULLNAME}-test", NAMESPACE)
    assert hook_of(pod) == hook_of(secret) == "test"
    assert base64.b64decode(secret["data"]["api-key"]).decode() == "sk-dev-b"
    assert TEST_KEY_SECRET not in [s["metadata"]["name"] for s in of_kind(manifests, "Secret")]
    env = container_env(pod["spec"])
    assert env["GATEWAY_URL"] == f"http://{FULLNAME}-gateway.{NAMESPACE}.svc:443"
    assert env["API_KEY"] == {"secretKeyRef": {"name": f"{FULLNAME}-test", "key": "api-key"}}
    assert env["API_KEYS_REFRESH_SECONDS"] == "10"
    assert (env["LANGUAGE"], env["CODE"], env["EXPECTED_STDOUT"]) == ("bash", "echo hi", "hi\n")
    script = pod["spec"]["containers"][0]["command"]
    assert script[:2] == ["python3", "-c"]
    assert script[2] == (CHART / "files" / "smoke_test.py").read_text()
    # No tenant, no test.apiKey: no key at all (the test pod says what to set).
    default_pod = find(rendered["default"], "Pod", f"{FULLNAME}-test")
    default_env = container_env(default_pod["spec"])
    assert "API_KEY" not in default_env
    assert default_env["API_KEYS_REFRESH_SECONDS"] == "30"  # the gateway's default
    default_secrets = [s["metadata"]["name"] for s in of_kind(rendered["default"], "Secret")]
    assert f"{FULLNAME}-test" not in default_secrets
    assert TEST_KEY_SECRET not in default_secrets


def generated_test_key(manifests: list[Manifest]) -> str:
    secret = find(manifests, "Secret", TEST_KEY_SECRET, NAMESPACE)
    return base64.b64decode(secret["data"]["api-key"]).decode()


def test_helm_test_has_a_key_of_its_own_with_hashed_keys(helm: Path, tmp_path: Path) -> None:
    manifests = render(helm, tmp_path, {"tenants": HASHED_TENANTS, "test": {"tenant": "team-b"}})
    secret = find(manifests, "Secret", TEST_KEY_SECRET, NAMESPACE)
    # A release object (not a hook), so it lives as long as the release; an upgrade finds it
    # with `lookup` and keeps its key (helm template has no cluster: a new key each time).
    assert hook_of(secret) == ""
    assert secret["metadata"]["annotations"]["sandpod.dev/chart-generated"] == "true"
    key = generated_test_key(manifests)
    assert key.startswith("sk-helm-test-") and len(key) == len("sk-helm-test-") + 40
    # Its digest, and only that, joins test.tenant's keys.
    keys_secret = find(manifests, "Secret", f"{FULLNAME}-api-keys", NAMESPACE)
    text = base64.b64decode(keys_secret["data"]["tenants.yaml"]).decode()
    assert key not in text
    config = parse_tenants_config(text)
    assert [(k.name, k.sha256) for k in config.tenants["team-b"].api_keys] == [
        ("ci-b", CI_B_KEY_DIGEST),
        ("helm-test", hashlib.sha256(key.encode()).hexdigest()),
    ]
    assert [k.name for k in config.tenants["team-a"].api_keys] == ["ci"]
    resolved = KeyIndex(config).resolve(key)
    assert resolved is not None and resolved.name == "team-b"
    # Only the test pod reads it, and no hook Secret holds a key.
    pod = find(manifests, "Pod", f"{FULLNAME}-test", NAMESPACE)
    api_key = container_env(pod["spec"])["API_KEY"]
    assert api_key == {"secretKeyRef": {"name": TEST_KEY_SECRET, "key": "api-key"}}
    for name, spec in pod_specs(manifests):
        assert (TEST_KEY_SECRET in json.dumps(spec)) == (name == f"{FULLNAME}-test"), name
    assert f"{FULLNAME}-test" not in [s["metadata"]["name"] for s in of_kind(manifests, "Secret")]
    # Without test.tenant: the first tenant.
    first = render(helm, tmp_path, {"tenants": HASHED_TENANTS})
    first_key = generated_test_key(first)
    first_text = find(first, "Secret", f"{FULLNAME}-api-keys")["data"]["tenants.yaml"]
    first_config = parse_tenants_config(base64.b64decode(first_text).decode())
    resolved = KeyIndex(first_config).resolve(first_key)
    assert resolved is not None and resolved.name == "team-a"


@pytest.mark.parametrize(
    "values",
    [
        {"test": {"enabled": False}},
        {"test": {"apiKey": "sk-ci-b"}},
        {"apiKeys": {"existingSecret": "from-vault"}},
        {"gateway": {"enabled": False}},
    ],
    ids=["test-off", "test-api-key", "existing-secret", "no-gateway"],
)
def test_no_generated_test_key_unless_the_test_needs_it(
    helm: Path, tmp_path: Path, values: dict[str, Any]
) -> None:
    manifests = render(helm, tmp_path, {"tenants": HASHED_TENANTS, **values})
    assert TEST_KEY_SECRET not in [s["metadata"]["name"] for s in of_kind(manifests, "Secret")]
    for secret in of_kind(manifests, "Secret"):
        if secret["metadata"]["name"] == f"{FULLNAME}-api-keys":
            text = base64.b64decode(secret["data"]["tenants.yaml"]).decode()
            assert "helm-test" not in text


def test_test_tenant_must_be_a_tenant(helm: Path, tmp_path: Path) -> None:
    completed = helm_template(helm, tmp_path, {"tenants": HASHED_TENANTS, "test": {"tenant": "x"}})
    assert completed.returncode != 0
    assert 'test.tenant names "x", which is not in tenants' in completed.stderr, completed.stderr


def test_uninstall_hook_releases_what_the_operator_served(
    rendered: dict[str, list[Manifest]],
) -> None:
    for scenario, served, binding_kinds in [
        ("default", "", {"ClusterRoleBinding"}),
        ("full", "team-a,shared", {"RoleBinding"}),
    ]:
        manifests = rendered[scenario]
        job = find(manifests, "Job", f"{FULLNAME}-uninstall", NAMESPACE)
        assert hook_of(job) == "pre-delete"
        env = container_env(job["spec"]["template"]["spec"])
        assert env["NAMESPACES"] == served
        assert env["FINALIZER"] == f"{GROUP}/operator"
        assert env["OPERATOR_DEPLOYMENT"] == f"{FULLNAME}-operator"
        operator = find(manifests, "Deployment", f"{FULLNAME}-operator")
        selector = ",".join(
            f"{k}={v}" for k, v in operator["spec"]["selector"]["matchLabels"].items()
        )
        assert sorted(env["OPERATOR_SELECTOR"].split(",")) == sorted(selector.split(","))
        bindings = bindings_of(manifests, f"{NAMESPACE}-{FULLNAME}-uninstall")
        assert {b["kind"] for b in bindings} == binding_kinds
        for manifest in manifests:
            if manifest["metadata"]["name"].endswith("-uninstall"):
                assert hook_of(manifest) == "pre-delete", names([manifest])


# --- values.schema.json ---


def test_schema_describes_every_value(values_schema: dict[str, Any]) -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(values: Any, schema: dict[str, Any], path: str) -> None:
        assert schema.get("description") or path == "", f"{path}: no description"
        if isinstance(values, dict) and "properties" in schema:
            for key, value in values.items():
                assert key in schema["properties"], f"{path}.{key} is not in values.schema.json"
                walk(value, schema["properties"][key], f"{path}.{key}")

    walk(defaults, values_schema, "")
    walk(FULL_VALUES, values_schema, "")


def test_schema_lists_every_setting(values_schema: dict[str, Any]) -> None:
    components = values_schema["properties"]
    for component, fields, managed in [
        ("operator", set(OperatorSettings.model_fields), CHART_MANAGED_OPERATOR_SETTINGS),
        ("gateway", set(GatewaySettings.model_fields), CHART_MANAGED_GATEWAY_SETTINGS),
    ]:
        listed = components[component]["properties"]["config"]["properties"]
        assert set(listed) == {camel(name) for name in fields - managed}


def test_schema_pools_are_the_pool_spec(values_schema: dict[str, Any]) -> None:
    """A tenant's pool takes what a SandboxPool's spec takes (by its aliases), and a name."""
    tenant = values_schema["properties"]["tenants"]["items"]["properties"]
    listed = set(tenant["pools"]["items"]["properties"])
    spec = {field.alias or name for name, field in SandboxPoolSpec.model_fields.items()}
    assert listed == spec | {"name"}


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"operator": {"config": {"maxMemry": "1Gi"}}}, "'maxMemry' not allowed"),
        ({"operator": {"config": {"maxMemory": "lots"}}}, "/operator/config/maxMemory"),
        ({"operator": {"logLevel": "loud"}}, "/operator/logLevel"),
        ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "/operator/watchNamespaces/0"),
        (
            {"tenants": [{"name": "team-a", "apiKeys": [{"name": "no-key"}]}]},
            "/tenants/0/apiKeys/0",
        ),
        ({"tenants": [{"name": "team-a", "limits": {"maxCpu": 1}}]}, "/tenants/0/limits/maxCpu"),
        (
            {"tenants": [{"name": "a", "limits": {"requestsPerSecond": 0}}]},
            "/tenants/0/limits/requestsPerSecond",
        ),
        (
            {"tenantNamespaces": {"objectQuota": {"hard": {"pods": 5}}}},
            "/tenantNamespaces/objectQuota/hard/pods",
        ),
        ({"tenants": [{"namespace": "x"}]}, "missing property 'name'"),
        (
            {"tenants": [{"name": "a", "pools": [{"name": "p", "language": "python"}]}]},
            "/tenants/0/pools/0",
        ),
        (
            {"tenants": [{"name": "a", "pools": [{"name": "p", "language": "bash", "size": 51}]}]},
            "/tenants/0/pools/0/size",
        ),
        (
            {"networkPolicies": {"apiServerEgress": {"enabled": True}}},
            "/networkPolicies/apiServerEgress",
        ),
        ({"catalog": {"languages": {"ruby": {"image": "ruby"}}}}, "/catalog/languages/ruby"),
        ({"egress": {"podCidrs": ["the pods"]}}, "/egress/podCidrs/0"),
        ({"egress": {"nodeCidrs": ["192.0.2.7"]}}, "/egress/nodeCidrs/0"),
        ({"egress": {"openCidrs": "0.0.0.0/0"}}, "/egress/openCidrs"),
        ({"egress": {"allowAll": True}}, "'allowAll' not allowed"),
        ({"tenants": [{"name": "a", "egress": {"allowed": []}}]}, "/tenants/0/egress"),
        ({"gateway": {"replica": 2}}, "'replica' not allowed"),
        ({"unknown": True}, "'unknown' not allowed"),
    ],
)
def test_schema_refuses_bad_values(
    helm: Path, tmp_path: Path, values: dict[str, Any], complaint: str
) -> None:
    completed = helm_template(helm, tmp_path, values)
    assert completed.returncode != 0
    assert complaint in completed.stderr, completed.stderr


# --- egress bounds ---


def test_egress_bounds_reach_the_operator(rendered: dict[str, list[Manifest]]) -> None:
    spec = find(rendered["full"], "Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"]
    settings = settings_from_env(container_env(spec), "sandpod_operator.settings.OperatorSettings")
    assert settings["egress_node_cidrs"] == ["192.0.2.10/32"]
    assert settings["egress_pod_cidrs"] == ["10.244.0.0/16"]
    assert settings["egress_service_cidrs"] == ["10.96.0.0/12"]
    # With networkPolicies.apiServerEgress.cidrs.
    assert settings["egress_api_server_cidrs"] == ["192.0.2.1/32", "192.0.2.2/32"]
    assert settings["egress_open_cidrs"] == ["203.0.113.0/24"]
    assert settings["egress_namespace_cidrs"] == {
        "team-a": ["1.1.1.0/24", "203.0.113.0/24"],
        "existing": [],
    }
    default = find(rendered["default"], "Deployment", f"{FULLNAME}-operator")["spec"]
    defaults = settings_from_env(
        container_env(default["template"]["spec"]), "sandpod_operator.settings.OperatorSettings"
    )
    fields = OperatorSettings.model_fields
    for name in CHART_MANAGED_OPERATOR_SETTINGS:
        if name.startswith("egress_") and not name.startswith("egress_proxy_"):
            assert defaults[name] == fields[name].get_default(call_default_factory=True), name


def cel_list(expression: str) -> Any:
    """A JSON literal rendered as a CEL expression, back as data."""
    return json.loads(expression)


def policy_variables(policy: Manifest) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def test_egress_admission_policy(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["full"]
    name = f"{NAMESPACE}-{FULLNAME}-egress"
    policy = find(manifests, "ValidatingAdmissionPolicy", name)
    assert policy["spec"]["failurePolicy"] == "Fail"
    # No parameter object: everything the policy needs is in it.
    assert "paramKind" not in policy["spec"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == ([GROUP], ["codeexecutions", "codesessions"])
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    variables = policy_variables(policy)
    assert cel_list(variables["opened"]) == ["203.0.113.0/24"]
    # "shared" has a tenant without egress: not narrowed.
    assert cel_list(variables["narrowed"]) == {
        "team-a": ["1.1.1.0/24", "203.0.113.0/24"],
        "existing": [],
    }
    excluded = cel_list(variables["excluded"])
    # The operator's ranges, in the operator's order, with its words.
    operator_bounds = make_bounds(
        [
            ("a node", ["192.0.2.10/32"]),
            ("the pod network", ["10.244.0.0/16"]),
            ("the service network", ["10.96.0.0/12"]),
            ("the API server", ["192.0.2.1/32", "192.0.2.2/32"]),
        ]
    )
    assert [(r["cidr"], r["what"], r["rule"]) for r in excluded] == [
        (str(r.network), r.what, r.rule) for r in operator_bounds.excluded
    ]
    assert {r["why"] for r in excluded} == {
        RULE_REASONS[PUBLIC_ONLY],
        RULE_REASONS[CLUSTER_NETWORK],
    }
    platform, tenant = policy["spec"]["validations"]
    assert platform["reason"] == tenant["reason"] == "Invalid"
    assert "egress rule " in platform["messageExpression"]
    assert "egress rule tenant: " in tenant["messageExpression"]
    # The tenant rule speaks only when the platform's rules pass: one message at a time.
    assert tenant["expression"].startswith("size(variables.hits) > 0 || ")
    assert not of_kind(rendered["minimal"], "ValidatingAdmissionPolicy")


def test_egress_binding_covers_the_served_namespaces(rendered: dict[str, list[Manifest]]) -> None:
    name = f"{NAMESPACE}-{FULLNAME}-egress"
    binding = find(rendered["full"], "ValidatingAdmissionPolicyBinding", name)
    assert binding["spec"]["policyName"] == name
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "shared"]}
    ]
    # Serving every namespace: the policy covers every namespace.
    default = find(rendered["default"], "ValidatingAdmissionPolicyBinding", name)
    assert "matchResources" not in default["spec"]


def test_the_egress_proxy(helm: Path, tmp_path: Path) -> None:
    values = {
        "tenants": [
            {"name": "team-a", "egress": {"hostPresets": ["pypi"], "allowedHosts": ["*.x.org"]}},
            {"name": "team-b"},
        ],
        "egress": {"openCidrs": ["203.0.113.0/24"], "podCidrs": ["10.244.0.0/16"]},
    }
    manifests = render(helm, tmp_path, values)
    config = find(manifests, "ConfigMap", f"{FULLNAME}-egress-proxy")["data"]["squid.conf"]
    lines = config.splitlines()
    excluded = next(line for line in lines if line.startswith("acl excluded dst")).split()[3:]
    assert {"169.254.0.0/16", "10.0.0.0/8", "10.244.0.0/16", "fe80::/10"} <= set(excluded)
    # Squid holds IPv4 as IPv4-mapped IPv6, inside ::/3: that range is refused apart.
    assert "::/3" not in excluded and "http_access deny reserved6 !ipv4" in lines
    assert lines.index("http_access deny !spliced !granted") < lines.index(
        "http_access allow opened"
    )
    assert lines.index("http_access allow opened") < lines.index("http_access deny excluded")
    assert lines.index("http_access deny excluded") < lines.index("http_access allow spliced")
    # HTTPS by TLS server name: peek, then splice or terminate; never bumped, never mimicked.
    port = lines[0].split()
    assert port[:3] == ["http_port", "3128", "ssl-bump"]
    assert "generate-host-certificates=off" in port
    assert [line for line in lines if line.startswith("ssl_bump")] == [
        "ssl_bump peek step1",
        "ssl_bump splice step2 server_name_granted",
        "ssl_bump terminate all",
    ]
    helper = next(line for line in lines if line.startswith("external_acl_type sandpod_server_"))
    assert "%>ha{Proxy-Authorization} %>rd %>rP %>a %ssl::>sni" in helper
    assert "--server-name" in helper
    assert "on_unsupported_protocol respond all" in lines
    pod = find(manifests, "Deployment", f"{FULLNAME}-egress-proxy")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"][:3] == ["openssl", "req", "-x509"]
    assert init["volumeMounts"] == [{"name": "tls", "mountPath": "/var/run/sandpod-proxy-tls"}]
    assert {"name": "tls", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in pod["volumes"]
    squid = next(c for c in pod["containers"] if c["name"] == "squid")
    assert {
        "name": "tls",
        "mountPath": "/var/run/sandpod-proxy-tls",
        "readOnly": True,
    } in squid["volumeMounts"]
    policy = find(manifests, "NetworkPolicy", f"{FULLNAME}-egress-proxy", NAMESPACE)["spec"]
    blocks = [peer["ipBlock"] for peer in policy["egress"][0]["to"]]
    assert blocks[0]["cidr"] == "0.0.0.0/0" and "169.254.0.0/16" in blocks[0]["except"]
    assert {"cidr": "203.0.113.0/24"} in blocks
    assert len(policy["egress"]) == 1  # no DNS unless egressProxy.dnsEgress names resolvers
    spec = find(manifests, "Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"]
    settings = settings_from_env(container_env(spec), "sandpod_operator.settings.OperatorSettings")
    assert settings["egress_namespace_hosts"] == {
        "team-a": ["*.x.org", "pypi.org", "files.pythonhosted.org"]
    }
    assert settings["egress_proxy_service"] == f"{NAMESPACE}/{FULLNAME}-egress-proxy"
    unknown = {"tenants": [{"name": "t", "egress": {"hostPresets": ["cran"]}}]}
    assert "egressProxy.presets does not define" in helm_template(helm, tmp_path, unknown).stderr


def test_the_egress_proxy_binds_grants_to_their_pods(helm: Path, tmp_path: Path) -> None:
    """The grant helper is given the client's address and asks the binder, the one container
    with an API token (list and watch pods, nothing else), which reaches the API server alone."""
    api = {"enabled": True, "cidrs": ["192.0.2.10/32"], "ports": [6443]}
    manifests = render(helm, tmp_path, {"networkPolicies": {"apiServerEgress": api}})
    name = f"{FULLNAME}-egress-proxy"
    lines = find(manifests, "ConfigMap", name)["data"]["squid.conf"].splitlines()
    helpers = [line for line in lines if line.startswith("external_acl_type")]
    assert len(helpers) == 2
    for helper in helpers:
        assert "%>rd %>rP %>a " in helper, helper
        assert "--binder=http://127.0.0.1:9182 " in helper, helper
    pod = find(manifests, "Deployment", name)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name and pod["automountServiceAccountToken"] is False
    mounts = {c["name"]: [m["name"] for m in c.get("volumeMounts", [])] for c in pod["containers"]}
    assert [c for c, names in mounts.items() if "api-token" in names] == ["binder"]
    binder = next(c for c in pod["containers"] if c["name"] == "binder")
    assert binder["command"] == ["sandpod-proxy-binder", "--host=0.0.0.0", "--port=9182"]
    assert binder["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "binder"}
    token = next(v for v in pod["volumes"] if v["name"] == "api-token")["projected"]["sources"]
    assert token[0]["serviceAccountToken"]["path"] == "token"
    role = find(manifests, "ClusterRole", f"{NAMESPACE}-{FULLNAME}-egress-proxy")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = find(manifests, "ClusterRoleBinding", f"{NAMESPACE}-{FULLNAME}-egress-proxy")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    policy = find(manifests, "NetworkPolicy", name, NAMESPACE)["spec"]
    assert {"to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
            "ports": [{"protocol": "TCP", "port": 6443}]} in policy["egress"]  # fmt: skip
    # Without the API server's addresses (helm template: no cluster to look them up in), the
    # binder reaches nothing, so the proxy refuses every grant: no wider rule is made up.
    default = find(render(helm, tmp_path, {}), "NetworkPolicy", name, NAMESPACE)["spec"]
    assert len(default["egress"]) == 1

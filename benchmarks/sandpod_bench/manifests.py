"""Manifests the bench creates (pure): CodeExecutions, and the baselines' pods and Jobs.

The baselines run the same program in the same image, RuntimeClass, resources and security
settings as a sandpod sandbox: their pod spec is that of a sandbox pod sandpod's operator made
(read back from the cluster), minus the runner and its input ConfigMap. Their pods are caught
by a deny-all NetworkPolicy of their own, as sandbox pods are by sandpod's, so the
NetworkPolicy enforcer does the same work for both.
"""

from __future__ import annotations

import copy
from typing import Any

from sandpod_contract.catalog import Catalog
from sandpod_contract.names import API_VERSION, GROUP, KIND, SESSION_KIND, VERSION

Manifest = dict[str, Any]

PROGRAM = "print(1)"
EXPECTED_STDOUT = "1\n"
LANGUAGE = "python"
TIMEOUT_SECONDS = 10
PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF = "sandpod-bench"
BASELINE_LABEL = "bench.sandpod.dev/baseline"
BASELINE_POLICY_NAME = "bench-baseline-deny-all"
SANDBOX_DIR = "/tmp/sandbox"
# llm-sandbox runs `python <file>`; the image has only python3, and its root is read-only.
SHIM_BIN_DIR = "/tmp/bin"
# The sandbox pod's volume with the runner's input (its ConfigMap), which the baselines lack.
INPUT_VOLUME = "input"
# What the API server and scheduler filled in on the sandbox pod, which a new pod must not
# carry (it would skip the scheduler, or be refused by the priority admission).
ASSIGNED_FIELDS = ("nodeName", "priority", "preemptionPolicy")


def code_execution(
    name: str, *, namespace: str | None = None, session: str | None = None
) -> Manifest:
    """print(1); with `session`, run in that CodeSession (its sandbox, its interpreter)."""
    metadata: Manifest = {"name": name, "labels": {PART_OF_LABEL: PART_OF}}
    if namespace:
        metadata["namespace"] = namespace
    spec: Manifest = {"language": LANGUAGE, "source": PROGRAM, "timeoutSeconds": TIMEOUT_SECONDS}
    if session:
        spec["session"] = session
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def code_session(name: str) -> Manifest:
    """A python session with the defaults (resources, idle timeout, lifetime)."""
    return {
        "apiVersion": API_VERSION,
        "kind": SESSION_KIND,
        "metadata": {"name": name, "labels": {PART_OF_LABEL: PART_OF}},
        "spec": {"language": LANGUAGE},
    }


def sandbox_pool(name: str, size: int, *, sessions: bool = False) -> Manifest:
    """A pool of ready sandboxes that the bench's executions (or, with `sessions`, its
    sessions) fit (default resources)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "metadata": {"name": name, "labels": {PART_OF_LABEL: PART_OF}},
        "spec": {"language": LANGUAGE, "size": size, "sessions": sessions},
    }


def baseline_pod(
    sandbox: Manifest,
    *,
    namespace: str,
    name: str,
    kind: str,
    catalog: Catalog,
    command: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Manifest:
    """The spec of `sandbox` (a sandbox pod sandpod made) running `python3 -c print(1)`
    directly (or `command`), without the runner's input."""
    spec = copy.deepcopy(sandbox["spec"])
    for assigned in ASSIGNED_FIELDS:
        spec.pop(assigned, None)
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] != INPUT_VOLUME]
    container = spec["containers"][0]
    container["volumeMounts"] = [
        mount for mount in container.get("volumeMounts") or [] if mount["name"] != INPUT_VOLUME
    ]
    container["command"] = command or ["python3", "-c", PROGRAM]
    container.pop("args", None)
    env = {**catalog.languages[LANGUAGE].env, **(extra_env or {})}
    container["env"] = [{"name": key, "value": value} for key, value in sorted(env.items())]
    labels = {PART_OF_LABEL: PART_OF, BASELINE_LABEL: kind}
    metadata = {"name": name, "namespace": namespace, "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def baseline_job(sandbox: Manifest, *, namespace: str, name: str, catalog: Catalog) -> Manifest:
    pod = baseline_pod(sandbox, namespace=namespace, name=name, kind="job", catalog=catalog)
    template_metadata = {"labels": copy.deepcopy(pod["metadata"]["labels"])}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": pod["metadata"]["labels"]},
        "spec": {
            "backoffLimit": 0,
            "template": {"metadata": template_metadata, "spec": pod["spec"]},
        },
    }


def llm_sandbox_pod(sandbox: Manifest, *, namespace: str, catalog: Catalog) -> Manifest:
    """A long-running pod llm-sandbox execs into (it names the pod itself)."""
    keep_running = (
        f"mkdir -p {SHIM_BIN_DIR} {SANDBOX_DIR} && ln -sf /usr/bin/python3 {SHIM_BIN_DIR}/python"
        " && exec sleep infinity"
    )
    pod = baseline_pod(
        sandbox,
        namespace=namespace,
        name="llm-sandbox",
        kind="llm-sandbox",
        catalog=catalog,
        command=["sh", "-c", keep_running],
        extra_env={"PATH": f"{SHIM_BIN_DIR}:/usr/local/bin:/usr/bin:/bin"},
    )
    return pod


def baseline_network_policy(namespace: str) -> Manifest:
    """Deny all traffic of the baselines' pods, like sandpod's policy for its sandboxes."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": BASELINE_POLICY_NAME,
            "namespace": namespace,
            "labels": {PART_OF_LABEL: PART_OF},
        },
        "spec": {
            "podSelector": {"matchExpressions": [{"key": BASELINE_LABEL, "operator": "Exists"}]},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }

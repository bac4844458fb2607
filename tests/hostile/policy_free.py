"""The network cases' own programs, run first where no NetworkPolicy applies.

A sandbox that cannot reach a target proves nothing unless the target is reachable without
the policy: an address nobody listens on, or a port bound to loopback, is "blocked" whatever
the policy does. So each network case of the corpus (those with `policy_free_stdout`) runs its
program, with the same arguments, in a pod like a sandbox (the language's image, gVisor, the
sandbox's uid, no capabilities, read-only root) in a namespace without any NetworkPolicy,
and with the cluster's DNS (a sandbox gets none). There it must reach every target; only then
does the sandbox's failure to reach them count, and it is the policy's doing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from corpus import Case
from kube_helpers import hardened_pod, pod_finished, wait_for_pod
from kubernetes import client
from sandpod_contract.catalog import load_catalog
from sandpod_testkit.kube import api_server_cidrs


@dataclass(frozen=True)
class PolicyFreeRun:
    """What a case's program printed in a pod that no NetworkPolicy selects."""

    case_id: str
    stdout: str
    phase: str
    policies: int  # NetworkPolicies in the namespace after the run (must be 0)

    def summary(self) -> str:
        return " | ".join(self.stdout.splitlines()) or f"nothing ({self.phase})"

    def problems(self, case: Case) -> list[str]:
        found = []
        if self.policies:
            found.append(f"the policy-free namespace has {self.policies} NetworkPolicies")
        pattern = case.policy_free_stdout
        if self.phase != "Succeeded" or pattern is None or not re.search(pattern, self.stdout):
            found.append(
                f"without the policy the program ended {self.phase} printing {self.stdout!r}, "
                f"expected {pattern!r}: the target is not shown reachable, so 'blocked' in the "
                "sandbox would prove nothing"
            )
        return found


def network_facts(api_client: client.ApiClient) -> dict[str, str]:
    """The cluster's own addresses, as the cluster says them: the kubernetes Service, the API
    server's endpoint (where kube-proxy sends that Service) and the cluster DNS Service."""
    core_v1 = client.CoreV1Api(api_client)
    kubernetes: Any = core_v1.read_namespaced_service("kubernetes", "default")
    dns: Any = core_v1.read_namespaced_service("kube-dns", "kube-system")
    addresses, ports = api_server_cidrs(api_client)
    return {
        "api_service": f"{kubernetes.spec.cluster_ip}:{kubernetes.spec.ports[0].port}",
        "api_endpoint": f"{addresses[0].removesuffix('/32')}:{ports[0]}",
        "dns_service": str(dns.spec.cluster_ip),
    }


def probe_pod(name: str, case: Case, args: list[str]) -> client.V1Pod:
    """A pod hardened like a sandbox, running the case's program directly (no runner)."""
    assert case.language == "python", f"{case.id}: only Python probes run without the policy"
    image = load_catalog().languages["python"].image
    probe = client.V1Container(
        name="probe",
        image=image,
        image_pull_policy="IfNotPresent",
        # python3 -c CODE ARGS: sys.argv[1:] are ARGS, as under the runner.
        command=["python3", "-c", case.code, *args],
        resources=client.V1ResourceRequirements(
            limits={"cpu": "500m", "memory": "128Mi"}, requests={"cpu": "10m", "memory": "128Mi"}
        ),
    )
    return hardened_pod(name, {"sandpod.dev/policy-free": case.id}, probe)


def run_one(
    core_v1: client.CoreV1Api, namespace: str, case: Case, args: list[str]
) -> PolicyFreeRun:
    name = f"policy-free-{case.id}"[:63]
    core_v1.create_namespaced_pod(namespace, probe_pod(name, case, args))
    pod = wait_for_pod(
        core_v1, namespace, name, until=pod_finished, timeout=120, what="the probe to finish"
    )
    stdout = core_v1.read_namespaced_pod_log(name, namespace, container="probe")
    policies = client.NetworkingV1Api(core_v1.api_client).list_namespaced_network_policy(namespace)
    return PolicyFreeRun(case.id, str(stdout), str(pod.status.phase), len(policies.items))


def run_policy_free(
    core_v1: client.CoreV1Api,
    namespace: str,
    cases: Iterable[Case],
    facts: dict[str, str],
) -> dict[str, PolicyFreeRun]:
    """Runs every network case's program in `namespace` (which has no NetworkPolicy), all at
    once, and returns what each printed."""
    network = [case for case in cases if case.policy_free_stdout is not None]
    with ThreadPoolExecutor(max_workers=max(1, len(network))) as pool:
        runs = pool.map(
            lambda case: run_one(core_v1, namespace, case, case.spec_for(facts).get("args", [])),
            network,
        )
        return {run.case_id: run for run in runs}

"""ResourceQuotas counted by the quota controller, before anything is created under them.

The API server refuses every create of a resource that a quota's status lists as hard but has
no usage for ("status unknown for quota"). The quota controller writes the status at once,
hard limits first, and the usage of each resource it can count; an object count of a custom
resource it can count only once its discovery (every 30 s) has found the CRD. A quota it
synced before that keeps its hard limits without that usage until its next full resync
(`--resource-quota-sync-period`, 5 minutes by default): a fresh cluster's CRD applied just
before the chart's install, or a CRD in the same release, leaves creates refused that long.
A new quota is synced again at once, so a quota stuck that way is re-created (same name,
labels, annotations and spec: still the release's).

    python -m sandpod_testkit.quotas --kubeconfig KUBECONFIG NAMESPACE...
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from kubernetes import client, config

from sandpod_testkit.waiting import WaitTimeout, wait_until

Quota = dict[str, Any]

# Longer than the controller's discovery period (30 s) and its informers' first sync.
RECREATE_AFTER_SECONDS = 40.0
DEFAULT_TIMEOUT_SECONDS = 180.0


def uncounted(quota: Quota) -> list[str]:
    """The resources `quota` limits that its status does not count yet."""
    status = quota.get("status") or {}
    hard, used = status.get("hard") or {}, status.get("used") or {}
    return sorted(
        name for name in quota["spec"].get("hard") or {} if not (name in hard and name in used)
    )


def stuck(quota: Quota) -> bool:
    """Whether the controller has synced `quota` (its status lists every hard limit) without
    counting all it limits: it waits for the next full resync."""
    hard = (quota.get("status") or {}).get("hard") or {}
    return bool(uncounted(quota)) and set(quota["spec"].get("hard") or {}) <= set(hard)


def recreated(quota: Quota) -> Quota:
    """The manifest that makes `quota` again, as new."""
    metadata = quota["metadata"]
    kept = {
        key: metadata[key]
        for key in ("name", "namespace", "labels", "annotations")
        if metadata.get(key)
    }
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": kept, "spec": quota["spec"]}


class QuotaWatch:
    """Reads the quotas of namespaces; re-creates each that stays stuck for
    `recreate_after` seconds."""

    def __init__(self, core: client.CoreV1Api, recreate_after: float) -> None:
        self.core = core
        self.recreate_after = recreate_after
        self.stuck_since: dict[str, float] = {}

    def quotas(self, namespace: str) -> list[Quota]:
        listed: Any = self.core.list_namespaced_resource_quota(namespace)
        serialize = self.core.api_client.sanitize_for_serialization
        return [serialize(item) for item in listed.items]

    def counted(self, namespaces: list[str]) -> bool:
        waiting = False
        for namespace in namespaces:
            for quota in self.quotas(namespace):
                if uncounted(quota):
                    waiting = True
                    self.unstick(quota)
        return not waiting

    def unstick(self, quota: Quota) -> None:
        uid = quota["metadata"]["uid"]
        if not stuck(quota):
            return
        now = time.monotonic()
        since = self.stuck_since.setdefault(uid, now)
        if now - since < self.recreate_after:
            return
        name, namespace = quota["metadata"]["name"], quota["metadata"]["namespace"]
        self.core.delete_namespaced_resource_quota(
            name,
            namespace,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
        )
        manifest: Any = recreated(quota)  # the client takes a plain manifest too
        self.core.create_namespaced_resource_quota(namespace, manifest)


def wait_for_quotas(
    core: client.CoreV1Api,
    *namespaces: str,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    recreate_after: float = RECREATE_AFTER_SECONDS,
) -> None:
    """Waits until every ResourceQuota in `namespaces` counts all it limits, re-creating any
    stuck (see the module's doc); after an install that made quotas, wait for this before
    creating anything there."""
    watch = QuotaWatch(core, recreate_after)
    wait_until(
        lambda: watch.counted(list(namespaces)),
        timeout=timeout,
        what=f"the ResourceQuotas in {', '.join(namespaces)} to count what they limit",
        interval=0.5,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS)
    parser.add_argument("namespaces", nargs="+")
    arguments = parser.parse_args()
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=arguments.kubeconfig
    )
    try:
        wait_for_quotas(client.CoreV1Api(api), *arguments.namespaces, timeout=arguments.timeout)
    except WaitTimeout as timeout:
        sys.exit(str(timeout))


if __name__ == "__main__":
    main()

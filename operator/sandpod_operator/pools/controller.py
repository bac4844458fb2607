"""The SandboxPool controller: keeps `size` free, started sandbox pods per pool.

One pass (`PoolController.reconcile`) reads the pool's pods, replaces free pods that are out of
date or dead, creates the missing ones (at most maxRefillPerMinute a minute), removes the
surplus, and writes the status. A kopf daemon runs passes per pool, woken at once by any event
of the pool or of its pods (a claim, a deletion), so a claimed pod is replaced without waiting
for a timer.

Only free pods count: a pod that an execution claimed (label pool-state=claimed, its
ownerReference moved to the execution) is never deleted here. Free pods are deleted with
their resourceVersion as a precondition, so a pod claimed meanwhile survives the deletion.
"""

import copy
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import kopf
from pydantic import ValidationError
from sandpod_contract.catalog import Catalog
from sandpod_contract.models import (
    Condition,
    SandboxPoolSpec,
    SandboxPoolStatus,
    format_time,
)
from sandpod_contract.names import POOL_FREE, POOL_STATE_LABEL, POOL_TEMPLATE_LABEL

from sandpod_operator.executions.builders import (
    InvalidSpecError,
    Sandbox,
    build_network_policy,
)
from sandpod_operator.kube import Manifest, PoolKubeApi
from sandpod_operator.owners import as_body
from sandpod_operator.pools.builders import (
    build_pool_configmap,
    build_pool_pod,
    build_runner_ingress_policy,
    plan_pool,
)
from sandpod_operator.settings import OperatorSettings
from sandpod_operator.status import pod_finished, set_condition, status_patch
from sandpod_operator.wakeups import Wakeups

logger = logging.getLogger(__name__)

REFILL_WINDOW_SECONDS = 60.0
READY_CONDITION = "Ready"
PoolKey = tuple[str, str]


def is_ready(pod: Manifest) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def controlled_by(pod: Manifest, uid: str) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(owner.get("uid") == uid and owner.get("controller") for owner in owners)


def free_pods(pods: list[Manifest], pool_uid: str) -> list[Manifest]:
    """The pool's unclaimed pods that are not on their way out."""
    return [
        pod
        for pod in pods
        if (pod["metadata"].get("labels") or {}).get(POOL_STATE_LABEL) == POOL_FREE
        and controlled_by(pod, pool_uid)
        and not pod["metadata"].get("deletionTimestamp")
    ]


def removal_order(pods: list[Manifest]) -> list[Manifest]:
    """Which free pods to remove first when the pool shrinks: those not ready, newest first."""
    by_age = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True)
    return sorted(by_age, key=is_ready)


@dataclass(frozen=True)
class Census:
    """What one pass found and did: free pods kept, how many of those are ready."""

    total: int
    ready: int
    limited: bool = False


def pool_status(
    pool: Manifest, census: Census, *, size: int, invalid: str | None, now: datetime
) -> Manifest:
    """The pool's whole status after a pass, built through its model."""
    previous = pool.get("status") or {}
    generation = pool["metadata"].get("generation")
    conditions = {c["type"]: c for c in previous.get("conditions") or [] if "type" in c}
    if invalid is not None:
        state, reason, message = "False", "InvalidSpec", invalid
    elif census.ready >= size:
        state, reason, message = "True", "Filled", f"{census.ready} of {size} pods ready"
    else:
        reason = "RefillLimited" if census.limited else "Filling"
        state, message = "False", f"{census.ready} of {size} pods ready"
    set_condition(conditions, READY_CONDITION, state, reason, message, format_time(now), generation)
    status = SandboxPoolStatus(
        ready=census.ready,
        total=census.total,
        conditions=[Condition.model_validate(conditions[k]) for k in sorted(conditions)],
        observed_generation=generation,
    )
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def spec_problem(pool: Manifest, catalog: Catalog, settings: OperatorSettings) -> str | None:
    """Why this operator cannot fill the pool, or None."""
    try:
        plan_pool(SandboxPoolSpec.model_validate(pool.get("spec") or {}), catalog, settings)
    except ValidationError as error:
        return "; ".join(
            f"spec.{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}"
            for problem in error.errors()
        )
    except InvalidSpecError as error:
        return str(error)
    return None


@dataclass
class PoolController:
    kube: PoolKubeApi
    settings: OperatorSettings
    catalog: Catalog
    clock: Callable[[], float] = time.monotonic
    # Per pool uid, when its recent pods were created (for maxRefillPerMinute).
    starts: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque))
    # Per pool uid, the template whose ConfigMap is in place.
    configs: dict[str, str] = field(default_factory=dict)
    # Namespaces whose NetworkPolicies this process has ensured.
    protected: set[str] = field(default_factory=set)
    wakeups: Wakeups = field(default_factory=Wakeups)

    # --- waking -----------------------------------------------------------------------

    def poke(self, key: PoolKey) -> None:
        self.wakeups.poke(key)

    async def wait(self, key: PoolKey, timeout: float) -> None:
        await self.wakeups.wait(key, timeout)

    def forget(self, key: PoolKey, uid: str) -> None:
        self.wakeups.forget(key)
        self.starts.pop(uid, None)
        self.configs.pop(uid, None)

    # --- one pass -----------------------------------------------------------------------

    async def reconcile(self, pool: Manifest) -> float | None:
        """One pass; returns how soon the next is due (a refill held back by the rate
        limit), or None when only events and the resync timer need to wake it."""
        meta = pool["metadata"]
        if meta.get("deletionTimestamp"):
            return None  # its free pods go with it (ownerReferences)
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        pods = free_pods(await self.kube.list_pool_pods(namespace, name), uid)
        spec_error = spec_problem(pool, self.catalog, self.settings)
        if spec_error is not None:
            logger.warning("pool %s/%s: %s", namespace, name, spec_error)
            await self._delete_free(namespace, pods)
            await self._write_status(pool, Census(total=0, ready=0), size=0, invalid=spec_error)
            return None
        spec = SandboxPoolSpec.model_validate(pool["spec"])
        template = await self._prepare(pool, plan_pool(spec, self.catalog, self.settings))
        kept = await self._remove_unfit(namespace, pods, template, spec.size)
        wanted = spec.size - len(kept)
        allowed = self._allowance(uid, wanted, spec.max_refill_per_minute)
        for _ in range(allowed):
            await self._create_pod(pool, template)
        census = Census(
            total=len(kept) + allowed,
            ready=sum(map(is_ready, kept)),
            limited=allowed < wanted,
        )
        await self._write_status(pool, census, size=spec.size, invalid=None)
        return self._next_slot(uid) if census.limited else None

    async def _prepare(self, pool: Manifest, sandbox: Sandbox) -> Manifest:
        """The namespace's policies and the pool's ConfigMap in place; the pod to create."""
        meta = pool["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if namespace not in self.protected:
            await self.kube.create_network_policy(build_network_policy(namespace), uid=None)
            ingress = build_runner_ingress_policy(namespace, self.settings.runner_ingress_from)
            if ingress is not None:
                await self.kube.create_network_policy(ingress, uid=None)
            self.protected.add(namespace)
        spec = SandboxPoolSpec.model_validate(pool["spec"])
        configmap = build_pool_configmap(
            namespace=namespace, pool_name=name, spec=spec, sandbox=sandbox, settings=self.settings
        )
        pod = build_pool_pod(
            namespace=namespace,
            pool_name=name,
            sandbox=sandbox,
            configmap=configmap,
            settings=self.settings,
            sessions=spec.sessions,
        )
        template = pod["metadata"]["labels"][POOL_TEMPLATE_LABEL]
        if self.configs.get(uid) != template:
            kopf.adopt(configmap, owner=as_body(pool))
            await self.kube.apply_configmap(configmap)
            self.configs[uid] = template
        return pod

    async def _remove_unfit(
        self, namespace: str, pods: list[Manifest], template: Manifest, size: int
    ) -> list[Manifest]:
        """Delete free pods that are dead, out of date, or beyond `size`; the ones kept."""
        current = template["metadata"]["labels"][POOL_TEMPLATE_LABEL]
        unfit = [
            pod
            for pod in pods
            if pod_finished(pod)
            or (pod["metadata"].get("labels") or {}).get(POOL_TEMPLATE_LABEL) != current
        ]
        fit = [pod for pod in pods if pod not in unfit]
        surplus = removal_order(fit)[: max(0, len(fit) - size)]
        await self._delete_free(namespace, [*unfit, *surplus])
        return [pod for pod in fit if pod not in surplus]

    async def _delete_free(self, namespace: str, pods: list[Manifest]) -> None:
        for pod in pods:
            meta = pod["metadata"]
            await self.kube.delete_pool_pod(
                namespace, meta["name"], resource_version=meta["resourceVersion"]
            )

    async def _create_pod(self, pool: Manifest, template: Manifest) -> None:
        pod = copy.deepcopy(template)
        kopf.adopt(pod, owner=as_body(pool))
        await self.kube.create_pool_pod(pod)
        self.starts[pool["metadata"]["uid"]].append(self.clock())

    def _allowance(self, uid: str, wanted: int, per_minute: int | None) -> int:
        """How many of `wanted` pods may start now."""
        if wanted <= 0:
            return 0
        if per_minute is None:
            return wanted
        starts = self.starts[uid]
        while starts and starts[0] <= self.clock() - REFILL_WINDOW_SECONDS:
            starts.popleft()
        return max(0, min(wanted, per_minute - len(starts)))

    def _next_slot(self, uid: str) -> float:
        """Seconds until the oldest start in the window leaves it."""
        starts = self.starts[uid]
        if not starts:
            return 0.0
        return max(0.0, starts[0] + REFILL_WINDOW_SECONDS - self.clock())

    async def _write_status(
        self, pool: Manifest, census: Census, *, size: int, invalid: str | None
    ) -> None:
        previous = pool.get("status") or {}
        new = pool_status(pool, census, size=size, invalid=invalid, now=datetime.now(UTC))
        patch = status_patch(previous, new)
        if patch:
            meta = pool["metadata"]
            await self.kube.patch_pool_status(meta["namespace"], meta["name"], patch)

"""kopf handlers of SandboxPools (thin): a daemon per pool runs the PoolController's passes;
every event of the pool or of one of its pods (a claim, a deletion, a pod becoming ready)
wakes it at once; and the indexes of pools and their pods that a claim reads. Registered by
importing this module (sandpod_operator.handlers does)."""

from typing import Any, cast

import kopf
from sandpod_contract.names import GROUP, POOL_LABEL, POOL_PLURAL, VERSION

from sandpod_operator.executions.handlers import plain
from sandpod_operator.executions.reconciler import is_transient
from sandpod_operator.kube import API_ERRORS
from sandpod_operator.pools.controller import PoolController

POOLS = (GROUP, VERSION, POOL_PLURAL)
PODS = ("v1", "pods")
TRANSIENT_DELAY_SECONDS = 2
# An API error that is not transient (e.g. a forbidden request) is retried less eagerly.
ERROR_DELAY_SECONDS = 30


def pools_of(memo: kopf.Memo) -> PoolController:
    return cast(PoolController, memo.pools)


@kopf.on.event(*POOLS)
async def pool_changed(
    event: kopf.RawEvent,
    namespace: str | None,
    name: str | None,
    uid: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    key = (namespace or "", name or "")
    if event.get("type") == "DELETED":
        pools_of(memo).forget(key, uid or "")
    else:
        pools_of(memo).poke(key)


@kopf.on.event(*PODS, labels={POOL_LABEL: kopf.PRESENT})
async def pool_pod_changed(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    pools_of(memo).poke((namespace or "", labels[POOL_LABEL]))


# Stopped by cancellation (at once): every pass is safe to cut short and to run again.
@kopf.daemon(*POOLS, cancellation_timeout=5)
async def keep_pool(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    pools = pools_of(memo)
    key = (body.metadata.namespace or "", body.metadata.name or "")
    while True:
        try:
            delay = await pools.reconcile(plain(body))
        except API_ERRORS as error:
            # kopf restarts the daemon after the delay.
            retry = TRANSIENT_DELAY_SECONDS if is_transient(error) else ERROR_DELAY_SECONDS
            raise kopf.TemporaryError(f"pool pass failed: {error}", delay=retry) from error
        await pools.wait(key, pools.settings.pool_resync_seconds if delay is None else delay)


@kopf.index(*POOLS)
def sandbox_pools(body: kopf.Body, namespace: str | None, **_: Any) -> dict[str, dict[str, Any]]:
    """namespace -> its pools, as last seen: an execution that fits one claims its pod."""
    return {namespace or "": plain(body)}


@kopf.index(*PODS, labels={POOL_LABEL: kopf.PRESENT})
def pool_pods(body: kopf.Body, namespace: str | None, **_: Any) -> dict[str, dict[str, Any]]:
    """namespace -> its pool pods, as last seen: a claim picks a free ready one without a
    list (a stale entry only costs a 409 and then a list)."""
    return {namespace or "": plain(body)}

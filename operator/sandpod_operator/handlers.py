"""The operator's kopf entry module: its startup and cleanup, its liveness probe, and the
rooms' handlers, registered by importing their modules (executions, pools, sessions, serving).

Run:  kopf run -m sandpod_operator.handlers --all-namespaces --standalone
"""

import asyncio
import logging
from typing import Any

import kopf
import prometheus_client
from sandpod_contract.catalog import load_catalog
from sandpod_contract.kube import open_api_client
from sandpod_contract.names import FINALIZER, GROUP, MANAGED_BY, MANAGED_BY_LABEL

from sandpod_operator.admission.handlers import ledger_of, start_ledger
from sandpod_operator.executions.handlers import (
    NETWORK_POLICIES,
    PODS,
    SANDBOX_POD_LABELS,
    index_of,
    reconciler_of,
    stalls_of,
)
from sandpod_operator.executions.queue import ExecutionQueue
from sandpod_operator.executions.reconciler import Reconciler
from sandpod_operator.executions.resync import resync_unstarted
from sandpod_operator.executions.stalls import StallDetector
from sandpod_operator.kube import Kube, RequestCounter
from sandpod_operator.pools import handlers as pool_handlers  # noqa: F401  (registers)
from sandpod_operator.pools.controller import PoolController
from sandpod_operator.serving.handlers import start_direct_path
from sandpod_operator.sessions import handlers as session_handlers  # noqa: F401  (registers)
from sandpod_operator.settings import OperatorSettings

KOPF_PREFIX = f"kopf.{GROUP}"
WATCH_SERVER_TIMEOUT_SECONDS = 300
# The executions queue looks again this often without a change (a release that failed).
QUEUE_BACKSTOP_SECONDS = 5.0


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    sandpod = OperatorSettings()
    catalog = load_catalog(sandpod.catalog_path)
    # kopf's bookkeeping in annotations under our prefix; the diff base leaves out the spec
    # (immutable, and up to 512 KiB: it would not fit the 256 KiB annotation limit).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, ignored_fields=["spec"]
    )
    settings.persistence.finalizer = FINALIZER
    # Our own Events mark phase transitions; kopf's per-handler "succeeded" ones are noise.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "sandpod-operator"
    selector = ",".join(f"{key}={value}" for key, value in SANDBOX_POD_LABELS.items())
    settings.watching.label_selectors[PODS] = selector
    settings.watching.label_selectors[NETWORK_POLICIES] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    # kopf's defaults wait forever on a watch: end each after 5 minutes (it resumes from its
    # resourceVersion) and drop a connection that stays silent longer than that.
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_SERVER_TIMEOUT_SECONDS + 30
    settings.watching.connect_timeout = 30
    kube = Kube(await open_api_client(), RequestCounter())
    start_ledger(memo, sandpod, kwargs)
    pools, pool_pod_runs = index_of(kwargs, "sandbox_pools"), index_of(kwargs, "pool_pod_runs")
    memo.reconciler = Reconciler(
        kube=kube,
        settings=sandpod,
        catalog=catalog,
        on_finished=ledger_of(memo).finished,
        pools_in=lambda namespace: list(pools.get(namespace, [])),
    )
    memo.reconciler.warm.runs_recorded_on = lambda namespace, pod: list(
        pool_pod_runs.get((namespace, pod), [])
    )
    memo.stalls = StallDetector(sandpod.stalled_after_seconds)
    memo.resync = asyncio.create_task(
        resync_unstarted(
            index_of(kwargs, "unstarted_executions"),
            kube,
            sandpod.resync_after_seconds,
            on_touch=stalls_of(memo).touched,
        )
    )
    memo.queue = ExecutionQueue(
        kube, index_of(kwargs, "queued_executions"), index_of(kwargs, "running_executions")
    )
    memo.queue_task = asyncio.create_task(memo.queue.run(QUEUE_BACKSTOP_SECONDS))
    memo.pools = PoolController(kube=kube, settings=sandpod, catalog=catalog)
    await start_direct_path(memo, sandpod, kwargs)
    if sandpod.metrics_port:
        prometheus_client.start_http_server(sandpod.metrics_port)


@kopf.on.probe(id="handlers")
def handlers_run(memo: kopf.Memo, **_: Any) -> str:
    """The liveness probe fails while kopf runs no handlers (executions/stalls.py)."""
    stalls: StallDetector | None = memo.get("stalls")  # None until the startup has run
    why = stalls.stalled() if stalls is not None else None
    if why is not None:
        raise kopf.PermanentError(why)
    return "running"


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    memo.resync.cancel()
    memo.queue_task.cancel()
    memo.records.cancel()
    if memo.direct_endpoint is not None:
        await memo.direct_endpoint.cleanup()
    await reconciler_of(memo).close()

"""The direct path's part in kopf: its endpoint started with the operator, the index of its
records (which it keeps bounded) and the stopping of a recorded run. Registered by importing
this module (sandpod_operator.handlers does)."""

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import kopf
from sandpod_contract.names import CANCEL_ANNOTATION, RECORD_DIRECT, RECORD_LABEL

from sandpod_operator.admission import endpoint as admission_endpoint
from sandpod_operator.admission.handlers import ledger_of
from sandpod_operator.executions.handlers import (
    EXECUTIONS,
    index_of,
    plain,
    reconciler_of,
    stalls_of,
)
from sandpod_operator.serving import endpoint as direct_endpoint
from sandpod_operator.serving.direct import DirectRuns, RecordEntry, keep_records
from sandpod_operator.settings import OperatorSettings


async def start_direct_path(
    memo: kopf.Memo, sandpod: OperatorSettings, handler_kwargs: Mapping[str, Any]
) -> None:
    """The direct path's endpoint (when configured) and the keeping of its records."""
    reconciler = reconciler_of(memo)
    runs = DirectRuns(reconciler.sessions, reconciler.kube, reconciler.store_outputs)
    memo.direct_runs = runs
    memo.records = asyncio.create_task(
        keep_records(runs, index_of(handler_kwargs, "direct_records"), sandpod)
    )
    memo.direct_endpoint = None
    if not (sandpod.direct_port and sandpod.direct_token_file):
        return
    token = Path(sandpod.direct_token_file).read_text().strip()
    sessions = index_of(handler_kwargs, "code_sessions")

    def session(namespace: str, name: str) -> dict[str, Any] | None:
        found = list(sessions.get((namespace, name), []))
        return reconciler.sessions.freshest(plain(found[0])) if found else None

    pools_index = index_of(handler_kwargs, "sandbox_pools")
    pods_index = index_of(handler_kwargs, "pool_pods")

    def pools(namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return list(pools_index.get(namespace, [])), list(pods_index.get(namespace, []))

    wait = sandpod.pod_startup_timeout_seconds
    app = direct_endpoint.create_app(runs, token, session, pools, starting_wait_seconds=wait)
    admission_endpoint.add_routes(app, ledger_of(memo), token, stalls_of(memo).any_ran)
    memo.direct_endpoint = await direct_endpoint.start(app, sandpod.direct_port)


@kopf.index(*EXECUTIONS, labels={RECORD_LABEL: RECORD_DIRECT})
def direct_records(
    namespace: str | None,
    name: str | None,
    uid: str | None,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    **_: Any,
) -> dict[str, RecordEntry]:
    """namespace -> its records of direct runs, as last seen: serving/direct.py keep_records looks
    them over."""
    ttl = spec.get("ttlSecondsAfterFinished")
    entry = RecordEntry(
        name=name or "",
        uid=uid or "",
        created=meta.get("creationTimestamp") or "",
        finished=status.get("finishedAt") or "",
        ttl_seconds=ttl if isinstance(ttl, int) else None,
    )
    return {namespace or "": entry}


# A record is not reconciled, but its run can still be stopped: the gateway's DELETE (or
# kubectl) sets the same annotation on it.
@kopf.on.event(
    *EXECUTIONS,
    labels={RECORD_LABEL: RECORD_DIRECT},
    annotations={CANCEL_ANNOTATION: "true"},
    when=lambda status, **_: not status,
)
async def cancel_direct_run(
    namespace: str | None, name: str | None, memo: kopf.Memo, **_: Any
) -> None:
    await cast(DirectRuns, memo.direct_runs).cancel(namespace or "", name or "")

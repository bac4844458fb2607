"""The direct path: a run in a live session goes from the gateway to this process and straight
to the session's runner; nothing on the way waits on the API server.

Its CodeExecution is written behind as the record, labelled sandpod.dev/record=direct so that
every handler leaves it alone: created while the program runs, its final status patched once
the answer is back (2 writes, none waited on, except that a run with output files has them
stored first, so that the gateway can read them). A record whose run this process never
finished (it restarted mid-run) ends Error/RecordLost; records go after their TTL, and beyond
`records_kept` per namespace the oldest finished ones go first.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sandpod_contract.models import BlockedEgress, format_time
from sandpod_contract.names import (
    FINISHED_LABEL,
    GROUP,
    KIND,
    RECORD_DIRECT,
    RECORD_LABEL,
    VERSION,
)
from sandpod_contract.runner import OutputListener

from sandpod_operator.kube import (
    API_ERRORS,
    TRANSIENT_ERRORS,
    Key,
    KubeApi,
    KubeError,
    Manifest,
)
from sandpod_operator.pools.warm import SANDBOXES_TRIED, execution_wants, tenant_of
from sandpod_operator.serving.core import NotServing, planned, serve_once
from sandpod_operator.sessions.controller import SessionController, StoringOutputs, now
from sandpod_operator.settings import OperatorSettings
from sandpod_operator.status import Verdict, next_status

logger = logging.getLogger(__name__)

# Answers kept for a retry of a run that has ended (same name: same answer, never a rerun).
RECENT_RUNS = 1024
STATUS_WRITE_ATTEMPTS = 5
# A record without a status this long past the longest run has no run left to finish it.
RECORD_LOST_SLACK_SECONDS = 60
# A sweep's deletes in flight at once: one after another, each waiting for a busy API server,
# records piled up faster than they went (a 30-minute soak: 2,175 deleted of 6,668 made).
SWEEP_DELETES_AT_ONCE = 16
RECORD_LOST_MESSAGE = (
    "the operator restarted while the program ran in its session; its result is unknown"
)


def build_record(execution: Manifest, namespace: str) -> Manifest:
    """The record of a direct run: the gateway's CodeExecution (its name, labels,
    annotations and spec, nothing else) in `namespace`, labelled as a finished record."""
    meta = execution.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), RECORD_LABEL: RECORD_DIRECT, FINISHED_LABEL: "true"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": meta.get("name"),
            "namespace": namespace,
            "labels": labels,
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": dict(execution.get("spec") or {}),
    }


@dataclass(frozen=True)
class RecordEntry:
    """A record as the operator's index last saw it."""

    name: str
    uid: str
    created: str
    finished: str
    ttl_seconds: int | None


@dataclass(frozen=True)
class Sweep:
    lost: list[RecordEntry]
    expired: list[RecordEntry]


def records_due(
    entries: Iterable[RecordEntry],
    now: datetime,
    *,
    keep: int,
    lost_after: timedelta,
    running: set[str],
) -> Sweep:
    """Of one namespace's records: those without a status that no run of this process will
    finish (`running`: names in progress) once `lost_after` has passed since their creation;
    those past their TTL, and the oldest finished beyond `keep`."""
    lost, finished = [], []
    for entry in entries:
        if entry.finished:
            finished.append(entry)
        elif entry.name not in running and now - _time(entry.created) >= lost_after:
            lost.append(entry)
    finished.sort(key=lambda entry: entry.finished)
    expired = finished[: max(0, len(finished) - keep)]
    for entry in finished[len(expired) :]:
        if entry.ttl_seconds is not None and now - _time(entry.finished) >= timedelta(
            seconds=entry.ttl_seconds
        ):
            expired.append(entry)
    return Sweep(lost, expired)


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


@dataclass
class DirectRuns:
    sessions: SessionController
    kube: KubeApi
    store_outputs: StoringOutputs
    # Runs in progress and the answers of recent ones, by (namespace, name).
    running: dict[Key, asyncio.Task[Manifest]] = field(default_factory=dict)
    recent: OrderedDict[Key, Manifest] = field(default_factory=OrderedDict)
    writers: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(
        self,
        namespace: str,
        execution: Manifest,
        session: Manifest,
        on_output: OutputListener | None = None,
    ) -> Manifest:
        """The record of a run in `session`, with its final status; `on_output` sees its
        output as it comes (the caller that started it, not one that re-attaches)."""
        run = partial(self._run, namespace, execution, session, on_output)
        return await self._once(namespace, execution, run)

    async def run_from_pool(
        self,
        namespace: str,
        execution: Manifest,
        pools: list[Manifest],
        pods: list[Manifest],
        on_output: OutputListener | None = None,
    ) -> Manifest:
        """The record of a one-off run in a free ready pod of one of `pools` (`pods`: theirs,
        as the operator's index shows them), with its final status; NotServing when no pod
        fits or is free (the gateway then creates the execution for the record path)."""
        run = partial(self._run_pooled, namespace, execution, pools, pods, on_output)
        return await self._once(namespace, execution, run)

    async def _once(
        self, namespace: str, execution: Manifest, start: Callable[[], Awaitable[Manifest]]
    ) -> Manifest:
        """Run once, whoever asks again (a retry with the same name re-attaches, or gets the
        answer it would have had)."""
        key = (namespace, str(execution["metadata"]["name"]))
        if key in self.recent:
            return self.recent[key]
        task = self.running.get(key)
        if task is None:
            task = asyncio.ensure_future(start())
            self.running[key] = task
            task.add_done_callback(lambda done: self._ended(key, done))
        # A caller that goes away does not stop the run: it ends and is recorded.
        return await asyncio.shield(task)

    async def cancel(self, namespace: str, name: str) -> bool:
        """Stop the direct run of that record if it runs here (its record ends Cancelled):
        whether it did."""
        if (namespace, name) not in self.running:
            return False
        await self.sessions.cancel(f"{namespace}/{name}")
        return True

    def _ended(self, key: Key, task: asyncio.Task[Manifest]) -> None:
        self.running.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            return
        self.recent[key] = task.result()
        while len(self.recent) > RECENT_RUNS:
            self.recent.popitem(last=False)

    async def _run(
        self,
        namespace: str,
        execution: Manifest,
        session: Manifest,
        on_output: OutputListener | None,
    ) -> Manifest:
        record = build_record(execution, namespace)
        run_id = f"{namespace}/{record['metadata']['name']}"
        warm = self.sessions.warm
        with warm.direct_marks(run_id), warm.listening(run_id, on_output):
            return await self._run_in_session(namespace, record, session, run_id)

    async def _run_in_session(
        self, namespace: str, record: Manifest, session: Manifest, run_id: str
    ) -> Manifest:
        creating: list[asyncio.Task[Manifest]] = []

        def create_record() -> None:
            self.sessions.warm.mark(run_id, "turn")
            creating.append(asyncio.create_task(self.kube.create_execution(record)))

        started = now()
        served = await self.sessions.run_direct(session, record, create_record)
        pod_name = (session.get("status") or {}).get("podName")
        return await self._recorded(
            record, creating[0], served.verdict, pod_name, served.blocked, started
        )

    async def _run_pooled(
        self,
        namespace: str,
        execution: Manifest,
        pools: list[Manifest],
        pods: list[Manifest],
        on_output: OutputListener | None,
    ) -> Manifest:
        warm, settings = self.sessions.warm, self.sessions.settings
        spec, plan = planned(execution, self.sessions.catalog, settings)
        record = build_record(execution, namespace)
        run_id = f"{namespace}/{record['metadata']['name']}"
        wanted, tenant = execution_wants(spec, plan), tenant_of(execution)
        with warm.direct_marks(run_id), warm.listening(run_id, on_output):
            pod = await warm.take(wanted, pools, pods, tenant, namespace)
            if pod is None:
                raise NotServing("no ready sandbox of a pool fits this run now")
            warm.mark(run_id, "turn")
            creating = asyncio.create_task(self.kube.create_execution(record))
            started = now()
            for attempt in range(1, SANDBOXES_TRIED + 1):
                answer = await serve_once(warm, pod, run_id, spec, plan, started, settings)
                warm.release(pod, serves_on=answer.serves_on)
                if not answer.serves_on:
                    self._behind(warm.remove(pod))
                # A runner that did not start the run (it ran another, or takes no more):
                # another sandbox may.
                if not answer.refused or attempt == SANDBOXES_TRIED:
                    break
                retry = await warm.take(wanted, pools, pods, tenant, namespace)
                if retry is None:
                    break
                pod = retry
        verdict = replace(answer.verdict, start_mode="warm", wait_ms=0)
        return await self._recorded(
            record, creating, verdict, pod["metadata"]["name"], None, started
        )

    async def _recorded(
        self,
        record: Manifest,
        creating: asyncio.Task[Manifest],
        verdict: Verdict,
        pod_name: str | None,
        blocked: list[BlockedEgress] | None,
        started: datetime,
    ) -> Manifest:
        """The record with the run's final status: written behind the answer, except that a
        run with output files has them stored (under the created record) first."""
        if verdict.files:
            created = await creating
            verdict = await self.store_outputs(created, verdict)
            status = _final_status(verdict, pod_name, blocked)
            await self._write_status(created, status)
            return {**created, "status": status}
        status = _final_status(verdict, pod_name, blocked)
        self._behind(self._finish_record(creating, status))
        metadata = {**record["metadata"], "creationTimestamp": format_time(started)}
        return {**record, "metadata": metadata, "status": status}

    def _behind(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self.writers.add(task)
        task.add_done_callback(self.writers.discard)

    async def _finish_record(self, creating: asyncio.Task[Manifest], status: Manifest) -> None:
        try:
            created = await creating
            await self._write_status(created, status)
        except API_ERRORS as error:
            logger.error("the record of a direct run was not written: %s", error)

    async def _write_status(self, created: Manifest, status: Manifest) -> None:
        """The record's one status write, at the version last read: a record changed since
        (the cancel annotation, a label) is read again; one with a status already is left."""
        meta = created["metadata"]
        version = meta["resourceVersion"]
        for attempt in range(STATUS_WRITE_ATTEMPTS):
            try:
                await self.kube.patch_execution_status(
                    meta["namespace"],
                    meta["name"],
                    uid=meta["uid"],
                    resource_version=version,
                    status=status,
                )
                return
            except KubeError as error:
                last = attempt + 1 == STATUS_WRITE_ATTEMPTS
                if last or not (error.status == 409 or error.transient):
                    raise
                if error.status == 409:
                    current = await self.kube.get_execution(
                        meta["namespace"], meta["name"], uid=meta["uid"]
                    )
                    if current is None or current.get("status"):
                        return
                    version = current["metadata"]["resourceVersion"]
                    continue
                await asyncio.sleep(0.5 * 2**attempt)
            except TRANSIENT_ERRORS:
                if attempt + 1 == STATUS_WRITE_ATTEMPTS:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)

    # --- the sweep ---------------------------------------------------------------------

    async def sweep(
        self, records: Mapping[str, Iterable[RecordEntry]], *, keep: int, lost_after: timedelta
    ) -> None:
        """End the records no run will finish (RecordLost); delete expired and excess ones."""
        at = now()
        for namespace, entries in records.items():
            names = {name for ns, name in self.running if ns == namespace}
            due = records_due(entries, at, keep=keep, lost_after=lost_after, running=names)
            for entry in due.lost:
                await self._record_lost(namespace, entry)
            await each_at_most(
                SWEEP_DELETES_AT_ONCE,
                [
                    self.kube.delete_execution(namespace, entry.name, uid=entry.uid)
                    for entry in due.expired
                ],
            )

    async def _record_lost(self, namespace: str, entry: RecordEntry) -> None:
        current = await self.kube.get_execution(namespace, entry.name, uid=entry.uid)
        if current is None or current.get("status"):
            return
        verdict = Verdict("Error", "RecordLost", RECORD_LOST_MESSAGE, retryable=True)
        await self._write_status(current, _final_status(verdict, None, None))


async def each_at_most(limit: int, calls: Sequence[Awaitable[None]]) -> None:
    """Awaits every call, at most `limit` at a time; the first error is raised once all
    have ended."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Awaitable[None]) -> None:
        async with gate:
            await call

    results = await asyncio.gather(*(one(call) for call in calls), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def _final_status(
    verdict: Verdict, pod_name: str | None, blocked: list[BlockedEgress] | None
) -> Manifest:
    at = now()
    final = verdict if verdict.finished_at else replace(verdict, finished_at=at)
    return next_status(None, final, generation=1, pod_name=pod_name, now=at, egress_blocked=blocked)


async def keep_records(
    runs: DirectRuns, records: Mapping[str, Iterable[RecordEntry]], settings: OperatorSettings
) -> None:
    """Forever: every `records_sweep_seconds`, `DirectRuns.sweep` the records indexed."""
    lost_after = timedelta(seconds=settings.longest_run_seconds + RECORD_LOST_SLACK_SECONDS)
    while True:
        await asyncio.sleep(settings.records_sweep_seconds)
        try:
            await runs.sweep(
                {namespace: list(entries) for namespace, entries in records.items()},
                keep=settings.records_kept_per_namespace,
                lost_after=lost_after,
            )
        except API_ERRORS as error:  # the next sweep tries again
            logger.warning("looking over the records failed: %s", error)

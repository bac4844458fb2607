"""Throughput: closed-loop clients for a fixed time, then an audit of every execution the
namespace saw against every answer the clients got (lost, duplicated, failed)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sandpod_bench.recorder import Observation, Recorder
from sandpod_bench.stats import summarize
from sandpod_bench.workloads import Attempt, Workload, _guarded


@dataclass(frozen=True)
class Finished:
    attempt: Attempt
    at: float  # seconds since the window opened


@dataclass(frozen=True)
class Audit:
    requests: int  # attempts started in the window
    succeeded: int  # correct results, whenever they came
    succeeded_in_window: int  # correct results that came within the window
    failed: int  # an answer, but not success (e.g. Error/Unschedulable, HTTP 4xx)
    lost: int  # no answer, an execution that never reached a terminal status, no record
    duplicated: int  # an execution run more than once, or returned to two requests
    orphaned: int  # executions in the namespace that no client heard of
    unrecorded: int  # answered, but its record never reached a terminal status (direct path)


def audit(
    finished: Sequence[Finished],
    observations: Sequence[Observation],
    window_seconds: float,
    refusals: tuple[str, ...] = ("HTTP 4",),
) -> Audit:
    """Pure: compares the clients' answers with what the namespace saw. An error answer
    that starts with one of `refusals` is a refusal (failed), not a loss; an execution it
    made all the same is still lost (orphaned: no client heard of it)."""
    names = Counter(f.attempt.name for f in finished if f.attempt.name)
    by_name = {o.name: o for o in observations}
    succeeded = [f for f in finished if f.attempt.ok]
    answered_names = set(names)
    lost = 0
    failed = 0
    for item in finished:
        if item.attempt.ok:
            continue
        observation = by_name.get(item.attempt.name) if item.attempt.name else None
        refused = (item.attempt.error or "").startswith(refusals)
        if (observation is not None and observation.terminal) or refused:
            failed += 1
        else:
            lost += 1
    unrecorded = sum(
        1
        for item in succeeded
        if item.attempt.name
        and not (by_name.get(item.attempt.name) and by_name[item.attempt.name].terminal)
    )
    run_twice = sum(1 for o in observations if len(o.pod_names) > 1)
    returned_twice = sum(count - 1 for count in names.values() if count > 1)
    orphaned = sum(1 for o in observations if o.name not in answered_names)
    return Audit(
        requests=len(finished),
        succeeded=len(succeeded),
        succeeded_in_window=sum(1 for f in succeeded if f.at <= window_seconds),
        failed=failed,
        lost=lost + orphaned + unrecorded,
        duplicated=run_twice + returned_twice,
        orphaned=orphaned,
        unrecorded=unrecorded,
    )


def run_closed_loop(
    workload: Workload, *, concurrency: int, duration_seconds: float
) -> tuple[list[Finished], float]:
    """`concurrency` clients, each starting a new attempt as soon as its last one ended,
    until `duration_seconds` have passed; attempts in flight then are finished. Returns the
    attempts and the time the last one took to drain."""
    results: list[Finished] = []
    lock = threading.Lock()
    counter = iter(range(10**9))
    opened = time.perf_counter()

    def client() -> None:
        while time.perf_counter() - opened < duration_seconds:
            with lock:
                index = next(counter)
            attempt = _guarded(workload, index)
            with lock:
                results.append(Finished(attempt, time.perf_counter() - opened))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.perf_counter() - opened


def settle(recorder: Recorder, timeout: float, names: Iterable[str] = ()) -> None:
    """Wait (bounded) until every execution the namespace saw, and each of `names` (a record
    written behind its answer may not have been seen yet), has a terminal status."""
    deadline = time.monotonic() + timeout
    for name in [*names, *(observation.name for observation in recorder.all())]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        recorder.wait_terminal(name, remaining)


def measure(
    workload: Workload,
    recorder: Recorder,
    *,
    path: str,
    concurrency: int,
    duration_seconds: float,
    settle_seconds: float = 120,
) -> tuple[dict[str, Any], list[Attempt]]:
    """The audited throughput, and every attempt."""
    earlier = {observation.name for observation in recorder.all()}  # warm-ups
    finished, elapsed = run_closed_loop(
        workload, concurrency=concurrency, duration_seconds=duration_seconds
    )
    settle(recorder, settle_seconds, [f.attempt.name for f in finished if f.attempt.name])
    seen = [observation for observation in recorder.all() if observation.name not in earlier]
    result = audit(finished, seen, duration_seconds)
    latency = summarize([f.attempt.seconds for f in finished if f.attempt.ok])
    errors = Counter(f.attempt.error for f in finished if not f.attempt.ok)
    summary = {
        "path": path,
        "concurrency": concurrency,
        "window_seconds": duration_seconds,
        "drained_after_seconds": elapsed,
        "executions_per_second": result.succeeded_in_window / duration_seconds,
        **asdict(result),
        "latency": latency.as_dict() if latency else None,
        "errors": dict(errors.most_common(5)),
    }
    return summary, [f.attempt for f in finished]

"""What the operator spends per execution: CPU seconds and memory of its process, and API
requests (all of them, counted by the proxy in front of it, and its own count)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandpod_bench.procstat import ProcessSample

MIB = 1024 * 1024


def counts_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    keys = set(before) | set(after)
    delta = {key: after.get(key, 0) - before.get(key, 0) for key in keys}
    return {key: value for key, value in sorted(delta.items()) if value}


@dataclass(frozen=True)
class CostSample:
    """The operator's spending so far: its process, the API requests the proxy counted by
    kind, and its own counters (requests, finished executions)."""

    process: ProcessSample
    requests: Mapping[str, int]
    own: tuple[float, float]


def cost_summary(
    executions: int, before: CostSample, after: CostSample, seconds: float
) -> dict[str, Any]:
    """Pure. What `executions` cost between two samples `seconds` apart."""
    if executions <= 0:
        raise ValueError("cost of no executions")
    delta = counts_delta(before.requests, after.requests)
    total_requests = sum(delta.values())
    own_requests = after.own[0] - before.own[0]
    own_finished = after.own[1] - before.own[1]
    start, end = before.process, after.process
    cpu = end.cpu_seconds - start.cpu_seconds
    return {
        "executions": executions,
        "wall_seconds": seconds,
        "cpu_seconds": cpu,
        "cpu_seconds_per_100_executions": cpu / executions * 100,
        "cpu_cores_busy": cpu / seconds if seconds > 0 else None,
        "rss_mib_before": start.rss_bytes / MIB,
        "rss_mib_after": end.rss_bytes / MIB,
        "rss_mib_growth_per_100_executions": (end.rss_bytes - start.rss_bytes)
        / MIB
        / executions
        * 100,
        "peak_rss_mib": end.peak_rss_bytes / MIB,
        "api_requests": total_requests,
        "api_requests_per_execution": total_requests / executions,
        "api_requests_per_execution_by_kind": {
            key: value / executions for key, value in delta.items()
        },
        "operator_counted_requests_per_execution": (
            own_requests / own_finished if own_finished else None
        ),
    }


def wait_quiet(
    read_counts: Callable[[], Mapping[str, int]], *, quiet_seconds: float, timeout: float
) -> bool:
    """Poll until the request counts stop moving for `quiet_seconds` (the operator has
    finished reacting: last status events, daemons stopping); False after `timeout`."""
    deadline = time.monotonic() + timeout
    last = dict(read_counts())
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        current = dict(read_counts())
        if current != last:
            last, since = current, time.monotonic()
        elif time.monotonic() - since >= quiet_seconds:
            return True
    return False

"""The soak section's pure parts: which phase an attempt belongs to, the quiet tenants'
latency per kind in the quiet phase next to the abusive one, what the abusive tenant's
requests got, and the cluster's and the operator's size over the run (the API server's
storage metrics, the operator's RSS)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sandpod_bench.stats import ratio, summarize

QUIET = "quiet"
ABUSIVE = "abusive"
# Issue 26: the quiet tenants' p99 while another tenant abuses the service, at most this
# many times their p99 in the quiet phase.
P99_FACTOR_TARGET = 2.0
# The database's size as the API server reports it, newest name first (Kubernetes 1.28
# renamed it; etcd's own name, when its metrics are scraped instead).
STORAGE_SIZE_METRICS = (
    "apiserver_storage_size_bytes",
    "apiserver_storage_db_total_size_in_bytes",
    "etcd_db_total_size_in_bytes",
)
OBJECTS_METRIC = "apiserver_storage_objects"
ABUSIVE_TENANT = "soak-abuse"
# With the soak named, the bench's gateway keeps a finished execution this long (the chart's
# default is an hour): a 30-minute soak then reaches the steady state in which records are
# deleted as fast as they are made, and whether the operator's memory and the database level
# off can be seen.
SOAK_RECORD_TTL_SECONDS = 300
# The abusive tenant's limits (tenants.yaml): a real rate, so that its floods meet 429s, and
# few executions, waits and sessions at once; the quiet tenants keep the bench's. Its running
# sandboxes (maxConcurrent x the default 500m of CPU) may take half of a 2-core node: with 8
# (its first 30-minute soak) it was entitled to the whole node, and the quiet tenants' one-off
# runs' p99 went to 2.1-2.8x their quiet phase's.
ABUSIVE_LIMITS = {
    "maxTimeoutSeconds": 60,
    "maxConcurrent": 2,
    "maxOpenWaits": 6,
    "maxWaitsPerExecution": 2,
    "maxSessions": 2,
    "requestsPerSecond": 5,
    "requestBurst": 10,
}


def phase_of(started_at: float, abusive_from: float) -> str:
    """The phase of an attempt by when it started (seconds since the soak began)."""
    return QUIET if started_at < abusive_from else ABUSIVE


@dataclass(frozen=True)
class Timed:
    """One quiet tenant's attempt: its kind (cold, pool, ...), phase, outcome, seconds."""

    tenant: str
    kind: str
    phase: str
    ok: bool
    seconds: float
    error: str | None = None


def compare_phases(attempts: Iterable[Timed]) -> list[dict[str, Any]]:
    """Per tenant and kind (in first-seen order): each phase's summary of its successful
    attempts, its failures, and the abusive phase's p50 and p99 over the quiet phase's."""
    grouped: dict[tuple[str, str], dict[str, list[Timed]]] = {}
    for attempt in attempts:
        phases = grouped.setdefault((attempt.tenant, attempt.kind), {QUIET: [], ABUSIVE: []})
        phases[attempt.phase].append(attempt)
    rows = []
    for (tenant, kind), phases in grouped.items():
        summaries = {}
        for phase, items in phases.items():
            summary = summarize(
                [a.seconds for a in items if a.ok], failures=sum(1 for a in items if not a.ok)
            )
            summaries[phase] = (
                summary.as_dict()
                if summary
                else {"count": 0, "failures": len(items)}  # nothing succeeded
            )
        errors = Counter(a.error for items in phases.values() for a in items if not a.ok)
        quiet, abusive = summaries[QUIET], summaries[ABUSIVE]
        p99_ratio = ratio(abusive.get("p99"), quiet.get("p99"))
        rows.append(
            {
                "tenant": tenant,
                "kind": kind,
                QUIET: quiet,
                ABUSIVE: abusive,
                "p50_ratio": ratio(abusive.get("p50"), quiet.get("p50")),
                "p99_ratio": p99_ratio,
                "p99_within_target": None if p99_ratio is None else p99_ratio <= P99_FACTOR_TARGET,
                "errors": {str(error): count for error, count in errors.most_common(3)},
            }
        )
    return rows


def outcome(status: int, body: Mapping[str, Any] | None) -> str:
    """What a gateway answer was, for counting: the status, and the error's code if any
    (429 rate_limited, 429 concurrency_limit, ...)."""
    error = (body or {}).get("error")
    code = error.get("code") if isinstance(error, Mapping) else None
    return f"{status} {code}" if code else str(status)


def count_outcomes(answers: Iterable[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """(behaviour, outcome) pairs -> behaviour -> outcome -> count, outcomes most common
    first."""
    counts: dict[str, Counter[str]] = {}
    for behaviour, answer in answers:
        counts.setdefault(behaviour, Counter())[answer] += 1
    return {behaviour: dict(found.most_common()) for behaviour, found in counts.items()}


@dataclass(frozen=True)
class StorageReading:
    """The API server's view of its database: its size (None when no metric names it),
    which metric said so, and the objects it stores by resource."""

    size_bytes: int | None
    metric: str | None
    objects: dict[str, int]


def parse_storage(text: str) -> StorageReading:
    """From the API server's metrics text: the database's size (the largest sample of the
    first metric present: one per etcd cluster, and the API server may list the same
    database more than once) and the stored objects per resource (those it knows)."""
    sizes: dict[str, float] = {}
    objects: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name in STORAGE_SIZE_METRICS:
            for sample in family.samples:
                sizes[family.name] = max(sizes.get(family.name, 0.0), sample.value)
        elif family.name == OBJECTS_METRIC:
            for sample in family.samples:
                if sample.value < 0:  # not known (its storage is being set up again)
                    continue
                resource = sample.labels.get("resource", "")
                objects[resource] = objects.get(resource, 0) + int(sample.value)
    for metric in STORAGE_SIZE_METRICS:
        if metric in sizes:
            return StorageReading(int(sizes[metric]), metric, objects)
    return StorageReading(None, None, objects)


@dataclass(frozen=True)
class ResourcePoint:
    """One sample of the run: seconds since the soak began, the operator's RSS, the
    database's size (and the metric that said it) and the stored objects of the resources
    followed."""

    at: float
    operator_rss_bytes: int | None
    storage_bytes: int | None
    storage_metric: str | None
    objects: dict[str, int]


def drift(points: Sequence[ResourcePoint], value: str) -> dict[str, Any] | None:
    """Start, end, peak and the change of one series (`operator_rss_bytes`,
    `storage_bytes`, or `objects:<resource>`) over the points that have it, and its change
    per minute over the last third of the run (flat at the end: near 0); None when none
    has."""
    series: list[tuple[float, float]] = []
    for point in points:
        if value.startswith("objects:"):
            found: float | None = point.objects.get(value.removeprefix("objects:"))
        else:
            found = getattr(point, value)
        if found is not None:
            series.append((point.at, float(found)))
    if not series:
        return None
    (start_at, start), (end_at, end) = series[0], series[-1]
    minutes = (end_at - start_at) / 60
    return {
        "start": start,
        "end": end,
        "peak": max(v for _, v in series),
        "change": end - start,
        "change_fraction": ratio(end - start, start),
        "per_minute": (end - start) / minutes if minutes > 0 else None,
        "last_third_per_minute": per_minute_since(series, end_at - (end_at - start_at) / 3),
        "samples": len(series),
    }


def per_minute_since(series: Sequence[tuple[float, float]], since: float) -> float | None:
    """The change per minute from the first point at or after `since` to the last."""
    tail = [(at, value) for at, value in series if at >= since]
    if len(tail) < 2 or tail[-1][0] <= tail[0][0]:
        return None
    return (tail[-1][1] - tail[0][1]) / ((tail[-1][0] - tail[0][0]) / 60)

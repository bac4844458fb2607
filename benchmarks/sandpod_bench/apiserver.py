"""API writes (and reads) as the API server itself counts them: `apiserver_request_total`
from its /metrics (read through the kube API, as kubectl get --raw /metrics does), by verb
and resource, before and after a measurement; the writes per run are the difference divided
by the runs. The counter is the whole cluster's: what else runs there is counted too (the
report says so)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

REQUESTS_METRIC = "apiserver_request"  # the parser drops the counter's _total
# The verbs that change state; the API server names them in capitals.
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
# Reads that are one round trip each (a WATCH is one long request).
READ_VERBS = frozenset({"GET", "LIST"})
# (verb, group/resource, e.g. "sandpod.dev/codeexecutions/status" or "pods") -> requests.
Requests = Counter[tuple[str, str]]
SANDPOD_GROUP = "sandpod.dev"
# The runs' records: CodeExecutions and their status.
RECORDS = f"{SANDPOD_GROUP}/codeexecutions"
_RECORDS = RECORDS.split("/")


def parse_requests(text: str) -> Requests:
    """The API server's write and read requests so far, by verb and resource (pure), from
    its metrics text; dry runs and requests it refused with a 4xx/5xx count too (they cost a
    round trip all the same)."""
    requests: Requests = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != REQUESTS_METRIC:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            labels = sample.labels
            verb = labels.get("verb", "")
            if verb not in WRITE_VERBS | READ_VERBS:
                continue
            resource = labels.get("resource") or "-"
            if labels.get("group"):
                resource = f"{labels['group']}/{resource}"
            if labels.get("subresource"):
                resource = f"{resource}/{labels['subresource']}"
            requests[(verb, resource)] += int(sample.value)
    return requests


@dataclass(frozen=True)
class WritesPerRun:
    runs: int
    writes: int
    per_run: float
    # Of them, writes of sandpod's own resources (CodeExecutions, sessions, pools).
    sandpod_per_run: float
    # Of those, writes of CodeExecutions (the runs' records, their status included).
    records_per_run: float
    # "VERB group/resource" -> writes per run, largest first (at most `top`).
    by_kind: dict[str, float]
    # Reads (GET, LIST) per run, and those of sandpod's resources by kind (at most `top`).
    reads_per_run: float
    sandpod_reads_by_kind: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def writes_per_run(
    before: Mapping[tuple[str, str], int],
    after: Mapping[tuple[str, str], int],
    runs: int,
    top: int = 8,
) -> WritesPerRun | None:
    """The writes (and reads) between two readings, per run (pure); None without runs. A
    counter that went down (the API server restarted in between) counts from zero."""
    if runs <= 0:
        return None
    writes: Counter[str] = Counter()
    reads: Counter[str] = Counter()
    for (verb, resource), value in after.items():
        grown = value - before.get((verb, resource), 0)
        if grown < 0:
            grown = value
        if grown:
            (writes if verb in WRITE_VERBS else reads)[f"{verb} {resource}"] += grown
    total = sum(writes.values())
    sandpod = sum(n for kind, n in writes.items() if _sandpod(kind))
    records = sum(n for kind, n in writes.items() if _resource(kind).split("/")[:2] == _RECORDS)
    sandpod_reads = Counter({kind: n for kind, n in reads.items() if _sandpod(kind)})
    return WritesPerRun(
        runs=runs,
        writes=total,
        per_run=total / runs,
        sandpod_per_run=sandpod / runs,
        records_per_run=records / runs,
        by_kind={kind: count / runs for kind, count in writes.most_common(top)},
        reads_per_run=sum(reads.values()) / runs,
        sandpod_reads_by_kind={
            kind: count / runs for kind, count in sandpod_reads.most_common(top)
        },
    )


def _resource(kind: str) -> str:
    """The group/resource of a "VERB group/resource" kind."""
    return kind.split(" ", 1)[1]


def _sandpod(kind: str) -> bool:
    return _resource(kind).startswith(SANDPOD_GROUP + "/")


def read_metrics(api: client.ApiClient) -> str:
    """The API server's metrics text now (GET /metrics through the kube API)."""
    request = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = api.call_api(*request, _request_timeout=30)
    body: bytes = response.read()  # type: ignore[no-untyped-call]
    return body.decode()


def read_requests(api: client.ApiClient) -> Requests:
    """The API server's request counts now."""
    return parse_requests(read_metrics(api))

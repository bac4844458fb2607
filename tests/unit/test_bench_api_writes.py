"""The bench's API writes per run: the API server's apiserver_request_total parsed from its
metrics text, and the writes (and reads) between two readings divided by the runs."""

import pytest
from sandpod_bench.apiserver import parse_requests, writes_per_run

# As kube-apiserver 1.34 writes it (labels trimmed to those the parser reads, plus some it
# ignores), with reads and another metric around.
METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, \
dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="sandpod.dev",\
resource="codeexecutions",scope="resource",subresource="",verb="POST",version="v1alpha1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="sandpod.dev",\
resource="codeexecutions",scope="resource",subresource="status",verb="PATCH",\
version="v1alpha1"} 38
apiserver_request_total{code="409",component="apiserver",dry_run="",group="sandpod.dev",\
resource="codeexecutions",scope="resource",subresource="status",verb="PATCH",\
version="v1alpha1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",\
resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 900
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",\
resource="pods",scope="namespace",subresource="",verb="WATCH",version="v1"} 30
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",\
resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",\
resource="pods",scope="resource",subresource="",verb="DELETE",version="v1"} 3
# HELP apiserver_request_duration_seconds Response latency distribution.
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{verb="POST",resource="pods",le="0.1"} 5
"""


def test_requests_are_counted_by_verb_and_resource_watches_left_out() -> None:
    assert parse_requests(METRICS) == {
        ("POST", "sandpod.dev/codeexecutions"): 40,
        ("PATCH", "sandpod.dev/codeexecutions/status"): 40,  # refused ones cost a trip too
        ("LIST", "pods"): 900,
        ("PUT", "coordination.k8s.io/leases"): 7,
        ("DELETE", "pods"): 3,
    }


def test_no_requests_metric_no_writes() -> None:
    assert parse_requests("# TYPE up gauge\nup 1\n") == {}


def test_writes_per_run_is_the_difference_divided_by_the_runs() -> None:
    before = {("POST", "sandpod.dev/codeexecutions"): 10, ("PUT", "coordination.k8s.io/leases"): 7}
    after = {
        ("POST", "sandpod.dev/codeexecutions"): 30,
        ("PATCH", "sandpod.dev/codeexecutions/status"): 20,
        ("PATCH", "sandpod.dev/codesessions/status"): 2,
        ("POST", "sandpod.dev/codeexecutionsx"): 2,  # not the records, for all its name
        ("PUT", "coordination.k8s.io/leases"): 9,
        ("DELETE", "pods"): 0,
        ("GET", "sandpod.dev/codesessions"): 20,
        ("GET", "sandpod.dev/codeexecutions"): 20,
        ("LIST", "pods"): 4,
    }
    writes = writes_per_run(before, after, runs=20)
    assert writes is not None
    assert (writes.writes, writes.per_run) == (46, 2.3)
    assert (writes.sandpod_per_run, writes.records_per_run) == (2.2, 2.0)
    assert writes.by_kind == {
        "POST sandpod.dev/codeexecutions": 1.0,
        "PATCH sandpod.dev/codeexecutions/status": 1.0,
        "PATCH sandpod.dev/codesessions/status": 0.1,
        "POST sandpod.dev/codeexecutionsx": 0.1,
        "PUT coordination.k8s.io/leases": 0.1,
    }
    assert writes.reads_per_run == pytest.approx(2.2)
    assert writes.sandpod_reads_by_kind == {
        "GET sandpod.dev/codesessions": 1.0,
        "GET sandpod.dev/codeexecutions": 1.0,
    }
    assert set(writes.as_dict()) == {
        "runs",
        "writes",
        "per_run",
        "sandpod_per_run",
        "records_per_run",
        "by_kind",
        "reads_per_run",
        "sandpod_reads_by_kind",
    }


def test_the_largest_kinds_are_kept() -> None:
    after = {("POST", f"r{i}"): i for i in range(1, 11)}
    writes = writes_per_run({}, after, runs=1, top=3)
    assert writes is not None
    assert list(writes.by_kind) == ["POST r10", "POST r9", "POST r8"]
    assert writes.writes == 55  # the total counts every kind


def test_a_counter_that_went_down_counts_from_zero() -> None:
    """The API server restarted between the readings: its counters started again."""
    writes = writes_per_run({("POST", "pods"): 500}, {("POST", "pods"): 4}, runs=2)
    assert writes is not None
    assert writes.per_run == pytest.approx(2.0)


def test_no_runs_no_rate() -> None:
    assert writes_per_run({}, {("POST", "pods"): 1}, runs=0) is None

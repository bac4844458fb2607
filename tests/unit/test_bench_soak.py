"""The soak section's pure parts: phases, the quiet tenants' latency in both phases, the
abusive tenant's answers, the API server's storage metrics, the drift of a series, its
tables, and that it runs only when named."""

from pathlib import Path

import pytest
from sandpod_bench import soak
from sandpod_bench.bench import gateway_settings
from sandpod_bench.main import parse_options
from sandpod_bench.options import SECTIONS
from sandpod_bench.recorder import Observation
from sandpod_bench.report import render
from sandpod_bench.sections.soak import REFUSALS
from sandpod_bench.soak import ABUSIVE, QUIET, SOAK_RECORD_TTL_SECONDS, ResourcePoint, Timed
from sandpod_bench.throughput import Finished, audit
from sandpod_bench.workloads import Attempt


def test_an_attempt_belongs_to_the_phase_it_started_in() -> None:
    assert soak.phase_of(59.9, abusive_from=60) == QUIET
    assert soak.phase_of(60.0, abusive_from=60) == ABUSIVE


def timed(kind: str, phase: str, seconds: float, ok: bool = True, tenant: str = "a") -> Timed:
    return Timed(tenant, kind, phase, ok, seconds, None if ok else "HTTP 503: busy")


def test_phases_are_compared_per_tenant_and_kind() -> None:
    attempts = [
        *(timed("pool", QUIET, s) for s in (0.1, 0.1, 0.2)),
        *(timed("pool", ABUSIVE, s) for s in (0.1, 0.3, 0.5)),
        timed("pool", ABUSIVE, 9.0, ok=False),
        *(timed("cold", QUIET, s, tenant="b") for s in (2.0, 2.0)),
        *(timed("cold", ABUSIVE, s, tenant="b") for s in (2.0, 2.2)),
    ]
    pool, cold = soak.compare_phases(attempts)
    assert (pool["tenant"], pool["kind"]) == ("a", "pool")
    assert pool[QUIET]["count"] == 3
    assert pool[ABUSIVE]["count"] == 3
    assert pool[ABUSIVE]["failures"] == 1  # the failed one's time is not a sample
    assert pool["p99_ratio"] == pytest.approx(0.496 / 0.198)
    assert pool["p99_within_target"] is False
    assert pool["errors"] == {"HTTP 503: busy": 1}
    assert cold["p50_ratio"] == pytest.approx(1.05)
    assert cold["p99_within_target"] is True


def test_a_phase_without_a_success_has_no_ratio() -> None:
    [row] = soak.compare_phases([timed("mcp", QUIET, 0.05), timed("mcp", ABUSIVE, 1.0, ok=False)])
    assert row[ABUSIVE] == {"count": 0, "failures": 1}
    assert row["p99_ratio"] is None
    assert row["p99_within_target"] is None


def test_answers_are_counted_by_status_and_error_code() -> None:
    assert soak.outcome(202, {"id": "cx-1"}) == "202"
    assert (
        soak.outcome(429, {"error": {"code": "rate_limited", "message": "..."}})
        == "429 rate_limited"
    )
    assert soak.outcome(502, None) == "502"
    counted = soak.count_outcomes(
        [
            ("flood", "429 rate_limited"),
            ("flood", "202"),
            ("flood", "429 rate_limited"),
            ("streams", "200, read to the end"),
        ]
    )
    assert counted == {
        "flood": {"429 rate_limited": 2, "202": 1},
        "streams": {"200, read to the end": 1},
    }
    assert list(counted["flood"]) == ["429 rate_limited", "202"]  # most common first


# As kube-apiserver 1.34 writes them (trimmed), with another metric around.
STORAGE = """\
# HELP apiserver_storage_objects [STABLE] Number of stored objects at the time of last check \
split by kind.
# TYPE apiserver_storage_objects gauge
apiserver_storage_objects{resource="codeexecutions.sandpod.dev"} 120
apiserver_storage_objects{resource="configmaps"} 40
apiserver_storage_objects{resource="pods"} 12
apiserver_storage_objects{resource="codesessions.sandpod.dev"} -1
# HELP apiserver_storage_size_bytes [STABLE] Size of the storage database file physically \
allocated in bytes.
# TYPE apiserver_storage_size_bytes gauge
apiserver_storage_size_bytes{storage_cluster_id="etcd-0"} 4.194304e+07
apiserver_storage_size_bytes{storage_cluster_id="etcd-0b"} 4.0e+07
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",verb="GET"} 5
"""


def test_the_database_size_and_objects_come_from_the_api_servers_metrics() -> None:
    reading = soak.parse_storage(STORAGE)
    assert reading.size_bytes == 41943040  # the largest sample
    assert reading.metric == "apiserver_storage_size_bytes"
    assert reading.objects == {"codeexecutions.sandpod.dev": 120, "configmaps": 40, "pods": 12}


def test_older_api_servers_name_the_size_otherwise() -> None:
    text = (
        "# TYPE apiserver_storage_db_total_size_in_bytes gauge\n"
        'apiserver_storage_db_total_size_in_bytes{endpoint="http://127.0.0.1:2379"} 2048\n'
    )
    reading = soak.parse_storage(text)
    assert (reading.size_bytes, reading.metric) == (
        2048,
        "apiserver_storage_db_total_size_in_bytes",
    )
    assert soak.parse_storage("# TYPE up gauge\nup 1\n").size_bytes is None


def point(at: float, rss: int | None, storage: int | None, executions: int) -> ResourcePoint:
    return ResourcePoint(
        at, rss, storage, "apiserver_storage_size_bytes", {"codeexecutions.sandpod.dev": executions}
    )


def test_drift_is_start_end_peak_and_change_of_the_points_that_have_it() -> None:
    points = [
        point(0, 100, None, 10),
        point(60, 130, 2000, 40),
        point(120, 110, 3000, 70),
        point(180, 120, None, 100),
    ]
    rss = soak.drift(points, "operator_rss_bytes")
    assert rss is not None
    assert (rss["start"], rss["end"], rss["peak"], rss["change"]) == (100, 120, 130, 20)
    assert rss["change_fraction"] == pytest.approx(0.2)
    assert rss["per_minute"] == pytest.approx(20 / 3)
    assert rss["last_third_per_minute"] == pytest.approx(10)  # 110 at 2 min, 120 at 3
    storage = soak.drift(points, "storage_bytes")
    assert storage is not None
    assert (storage["start"], storage["end"], storage["samples"]) == (2000, 3000, 2)
    assert storage["per_minute"] == pytest.approx(1000)
    objects = soak.drift(points, "objects:codeexecutions.sandpod.dev")
    assert objects is not None and objects["change"] == 90
    assert soak.drift(points, "objects:pods") is None
    assert soak.drift([point(0, None, None, 1)], "storage_bytes") is None


def test_the_soak_tables_in_the_report() -> None:
    kinds = soak.compare_phases(
        [timed("pool", QUIET, 0.1), timed("pool", ABUSIVE, 0.5), timed("cold", QUIET, 2.0)]
    )
    section = {
        "minutes": 4.0,
        "quiet_minutes": 1.0,
        "abusive_tenant": "soak-abuse",
        "kinds": kinds,
        "start_modes": {"a, pool, abusive": {"warm": 3, "cold": 1}},
        "audit": {
            "soak-a": {"requests": 9, "succeeded": 9, "failed": 0, "lost": 0, "duplicated": 0}
        },
        "abusive_answers": {"flood": {"429 rate_limited": 80, "202": 20}},
        "resources": {
            "operator_rss_bytes": soak.drift(
                [point(0, 100 * 1024 * 1024, 0, 0), point(60, 110 * 1024 * 1024, 0, 0)],
                "operator_rss_bytes",
            ),
            "storage_bytes": None,
        },
    }
    text = render({"soak": section})
    assert "a, pool" in text
    assert "5.00x" in text  # the pool's p99 ratio
    assert "beyond for a, pool" in text
    assert "not measured for a, cold" in text
    assert "429 rate_limited" in text
    assert "started: a, pool, abusive: 1 cold, 3 warm" in text
    assert "100.0 MiB" in text and "+10%" in text
    assert "not read" in text.splitlines()[-1]


def test_the_soak_runs_only_when_named() -> None:
    assert "soak" not in parse_options([]).sections
    assert "soak" not in SECTIONS
    options = parse_options(["--sections", "soak", "--soak-minutes", "8"])
    assert options.sections == ("soak",)
    assert (options.soak_minutes, options.soak_quiet_minutes) == (8.0, 2.0)
    assert parse_options(["--quick"]).soak_minutes == 4.0
    with pytest.raises(SystemExit):
        parse_options(["--soak-minutes", "4", "--soak-quiet-minutes", "4"])


def test_the_soak_counts_a_503_as_a_refusal_unless_it_made_a_run() -> None:
    """The shared cluster's API server goes away at times: the gateway's 503 refuses the run
    (failed); a run it made all the same, whose id no client got, is still lost."""
    finished = [
        Finished(Attempt(True, 0.1, "ok"), 1.0),
        Finished(Attempt(False, 0.1, error="HTTP 503: kubernetes_unavailable"), 2.0),
        Finished(Attempt(False, 0.1, error="HTTP 429: rate_limited"), 3.0),
    ]
    seen = [observation("ok"), observation("made-anyway")]
    result = audit(finished, seen, 10.0, REFUSALS)
    assert (result.failed, result.lost, result.orphaned) == (2, 1, 1)
    assert audit(finished, seen, 10.0).lost == 2  # the throughputs' audit: a 503 is a loss


def observation(name: str) -> Observation:
    return Observation("ns", name, execution={"status": {"phase": "Succeeded"}})


def test_with_the_soak_named_the_gateway_keeps_finished_executions_briefly() -> None:
    ttl = "SANDPOD_GATEWAY_TTL_SECONDS_AFTER_FINISHED"
    settings = gateway_settings(parse_options(["--sections", "soak"]), "http://direct", Path("t"))
    assert settings[ttl] == str(SOAK_RECORD_TTL_SECONDS)
    assert settings["SANDPOD_GATEWAY_DIRECT_URL"] == "http://direct"
    assert ttl not in gateway_settings(parse_options([]), "http://direct", Path("t"))

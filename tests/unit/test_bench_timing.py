"""The benchmark's timing sources: breakdown slices, containerd events, /proc parsing."""

import pytest
from sandpod_bench.breakdown import (
    DIRECT_MILESTONE_NAMES,
    KINDS,
    MILESTONE_NAMES,
    kubernetes_timestamps,
    largest,
    slices,
    summarize_slices,
)
from sandpod_bench.containerd import ContainerdLedger, parse_event_line
from sandpod_bench.procstat import parse_cpu_seconds, parse_status_kib
from sandpod_bench.timings import parse_marks
from sandpod_contract.names import DIRECT_TIMINGS_LOG


def full_timeline(step: float = 0.1) -> dict[str, float]:
    return {name: 1000.0 + index * step for index, name in enumerate(MILESTONE_NAMES)}


def test_slices_run_from_submit_to_the_client_and_add_up() -> None:
    timeline = full_timeline()
    timeline["client_returned"] += 1.0
    result = slices(timeline)
    assert [s.milestone for s in result] == list(MILESTONE_NAMES[1:])
    assert sum(s.seconds for s in result) == pytest.approx(
        timeline["client_returned"] - timeline["submitted"]
    )
    assert result[-1].seconds == pytest.approx(1.1)
    assert not any(s.estimated for s in result)


def test_a_missing_milestone_borrows_the_next_ones_time() -> None:
    timeline = full_timeline()
    del timeline["runner_started"]
    result = {s.milestone: s for s in slices(timeline)}
    assert result["runner_started"].estimated
    assert result["program_exited"].estimated
    assert result["program_exited"].seconds == 0.0
    assert result["runner_started"].seconds == pytest.approx(0.2)


def test_slices_never_go_negative_across_the_two_watches() -> None:
    timeline = full_timeline()
    timeline["operator_seen"] = timeline["pod_created"] + 0.05  # arrived late on its stream
    assert all(s.seconds >= 0 for s in slices(timeline))


def test_slices_need_both_ends() -> None:
    timeline = full_timeline()
    del timeline["client_returned"]
    with pytest.raises(ValueError):
        slices(timeline)


def test_summaries_take_medians_and_name_the_largest() -> None:
    fast, slow, middle = full_timeline(0.1), full_timeline(0.3), full_timeline(0.2)
    summaries = summarize_slices([slices(fast), slices(slow), slices(middle)])
    assert all(s.median_seconds == pytest.approx(0.2) for s in summaries)
    assert sum(s.share for s in summaries) == pytest.approx(1.0)
    middle["sandbox_started"] += 5.0
    for later in MILESTONE_NAMES[MILESTONE_NAMES.index("sandbox_started") + 1 :]:
        middle[later] += 5.0
    biggest = largest(summarize_slices([slices(middle)]))
    assert biggest is not None and biggest.milestone == "sandbox_started"


def test_kubernetes_timestamps_of_an_execution_and_its_pod() -> None:
    execution = {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Succeeded", "durationMs": 41, "finishedAt": "2026-01-01T00:00:02Z"},
    }
    pod = {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {
            "conditions": [{"type": "PodScheduled", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "startedAt": "2026-01-01T00:00:01Z",
                            "finishedAt": "2026-01-01T00:00:01Z",
                        }
                    }
                }
            ],
        },
    }
    found = kubernetes_timestamps(execution, pod)
    assert found["execution.status.durationMs"] == 41
    assert found["pod.condition.PodScheduled"] == "2026-01-01T00:00:00Z"
    assert found["pod.container.finishedAt"] == "2026-01-01T00:00:01Z"
    assert kubernetes_timestamps(None, None) == {}


CREATE = (
    '2026-11-22 03:33:28.747770279 +0000 UTC k8s.io /containers/create {"id":"sb1",'
    '"image":"localhost/sandpod/pause:3.10","runtime":{"name":"io.containerd.runsc.v1"}}'
)
UPDATE = (
    '2026-11-22 03:33:28.749921289 +0000 UTC k8s.io /containers/update {"id":"sb1",'
    '"labels":{"io.cri-containerd.kind":"sandbox","io.kubernetes.pod.name":"p",'
    '"io.kubernetes.pod.namespace":"bench-1-kubectl"}}'
)


def test_parse_a_containerd_event_line_to_the_nanosecond() -> None:
    event = parse_event_line(CREATE)
    assert event is not None
    assert event.topic == "/containers/create"
    assert event.namespace == "k8s.io"
    assert event.payload["id"] == "sb1"
    assert event.time == pytest.approx(1795318408.747770279, abs=1e-6)


def test_lines_that_are_not_events_are_skipped() -> None:
    assert parse_event_line("") is None
    assert parse_event_line("ctr: failed to dial") is None
    assert parse_event_line("2026-11-22 03:33:28.7 +0000 UTC k8s.io /tasks/exit {not json") is None


def test_the_ledger_follows_a_pods_sandbox_and_container() -> None:
    ledger = ContainerdLedger("bench-1")
    lines = [
        CREATE,
        UPDATE,
        '2026-11-22 03:33:29.125 +0000 UTC k8s.io /tasks/start {"container_id":"sb1","pid":1}',
        '2026-11-22 03:33:29.156 +0000 UTC k8s.io /containers/create {"id":"c1"}',
        '2026-11-22 03:33:29.255 +0000 UTC k8s.io /tasks/start {"container_id":"c1","pid":1}',
        # an exec'd process exiting is not the container exiting
        '2026-11-22 03:33:29.300 +0000 UTC k8s.io /tasks/exit {"container_id":"c1","id":"x"}',
        '2026-11-22 03:33:29.361 +0000 UTC k8s.io /tasks/exit {"container_id":"c1","id":"c1"}',
        '2026-11-22 03:33:29.400 +0000 UTC moby /tasks/exit {"container_id":"c1","id":"c1"}',
    ]
    for line in lines:
        event = parse_event_line(line)
        assert event is not None
        ledger.apply(event)
    sandbox = ledger.sandbox("bench-1-kubectl", "p")
    assert sandbox is not None and sandbox.started is not None and sandbox.created is not None
    assert sandbox.started - sandbox.created == pytest.approx(0.377, abs=1e-3)
    container = ledger.container("containerd://c1")
    assert container is not None and container.started is not None
    assert container.exited is not None
    assert container.exited - container.started == pytest.approx(0.106, abs=1e-3)
    assert ledger.sandbox("other", "p") is None


STAT = (
    "4242 (kopf run (x)) S 1 4242 4242 0 -1 4194560 9000 0 0 0 "
    "250 130 0 0 20 0 5 0 100 800000000 25000 18446744073709551615"
)


def test_cpu_seconds_count_fields_after_the_command_name() -> None:
    assert parse_cpu_seconds(STAT, ticks_per_second=100) == pytest.approx(3.8)


def test_status_sizes_in_bytes() -> None:
    status = "Name:\tkopf\nVmHWM:\t  120000 kB\nVmRSS:\t  100000 kB\n"
    assert parse_status_kib(status, "VmRSS") == 100000 * 1024
    assert parse_status_kib(status, "VmHWM") == 120000 * 1024
    with pytest.raises(KeyError):
        parse_status_kib(status, "VmSwap")


WARM_LINE = (
    "[2026-11-26 11:00:00,000] sandpod_operator.pools.warm [INFO] warm timings ns/cx-1 "
    '{"claiming": 100.0, "claimed": 100.02, "posted": 100.05}'
)
DIRECT_LINE = (
    "[2026-11-26 11:00:01,000] sandpod_operator.pools.warm [INFO] direct timings ns/cx-2 "
    '{"received": 200.0, "turn": 200.001, "posted": 200.002, "first_frame": 200.004, '
    '"summary": 200.005, "done": 200.006, "answered": 200.003}'
)


def test_the_operators_timing_lines_are_read_by_kind() -> None:
    lines = [WARM_LINE, DIRECT_LINE, "unrelated", "direct timings ns/cx-3 {not json"]
    assert parse_marks(lines) == {
        ("ns", "cx-1"): {"op_claiming": 100.0, "op_claimed": 100.02, "op_posted": 100.05}
    }
    direct = parse_marks(lines, DIRECT_TIMINGS_LOG)
    assert list(direct) == [("ns", "cx-2")]
    assert direct[("ns", "cx-2")]["op_turn"] == 200.001


def test_a_direct_run_divides_from_the_client_through_the_operators_marks() -> None:
    marks = parse_marks([DIRECT_LINE], DIRECT_TIMINGS_LOG)[("ns", "cx-2")]
    timeline = {**marks, "submitted": 199.998, "client_returned": 200.008}
    names, slice_names = KINDS["direct"]
    parts = {s.milestone: s for s in slices(timeline, names, slice_names)}
    assert list(parts) == list(DIRECT_MILESTONE_NAMES[1:])
    assert parts["op_received"].name.endswith("gateway: auth, admission, post to the operator")
    assert parts["op_first_frame"].seconds == pytest.approx(0.002)
    assert parts["client_returned"].seconds == pytest.approx(0.002)
    assert sum(s.seconds for s in parts.values()) == pytest.approx(0.010)
    assert not any(s.estimated for s in parts.values())


def test_every_kind_names_each_of_its_slices() -> None:
    for names, slice_names in KINDS.values():
        assert names[0] == "submitted" and names[-1] == "client_returned"
        assert set(slice_names) == set(names[1:])

"""The benchmark's pure parts: percentiles, summaries, ratios and the printed tables."""

import pytest
from sandpod_bench.report import baseline_ratios, latency_table, render, table
from sandpod_bench.stats import percentile, ratio, summarize


def test_percentile_interpolates_between_closest_ranks() -> None:
    samples = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(samples, 0.0) == 1.0
    assert percentile(samples, 1.0) == 4.0
    assert percentile(samples, 0.5) == pytest.approx(2.5)
    assert percentile(samples, 0.95) == pytest.approx(3.85)


def test_percentile_of_one_sample_is_that_sample() -> None:
    assert percentile([7.0], 0.99) == 7.0


def test_percentile_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        percentile([], 0.5)
    with pytest.raises(ValueError):
        percentile([1.0], 1.5)


def test_p99_of_a_hundred_samples() -> None:
    samples = [float(i) for i in range(1, 101)]
    summary = summarize(samples, failures=2)
    assert summary is not None
    assert summary.count == 100
    assert summary.failures == 2
    assert summary.p50 == pytest.approx(50.5)
    assert summary.p99 == pytest.approx(99.01)
    assert summary.mean == pytest.approx(50.5)
    assert (summary.minimum, summary.maximum) == (1.0, 100.0)


def test_no_successful_sample_has_no_summary() -> None:
    assert summarize([], failures=3) is None


def test_ratio_is_none_when_a_side_is_missing() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(3.0, None) is None
    assert ratio(3.0, 0.0) is None


def test_table_aligns_columns() -> None:
    text = table(["name", "value"], [["a", "1"], ["longer", "22"]])
    lines = text.splitlines()
    assert lines[0] == "name    value"
    assert lines[1] == "------  -----"
    assert lines[2] == "a           1"
    assert lines[3] == "longer     22"


def entry(p50: float, *, concurrency: int = 1, label: str = "x") -> dict[str, object]:
    return {
        "label": label,
        "concurrency": concurrency,
        "summary": {
            "count": 10,
            "failures": 0,
            "mean": p50,
            "p50": p50,
            "p95": p50 * 2,
            "p99": p50 * 3,
            "minimum": p50,
            "maximum": p50 * 3,
        },
    }


def test_ratios_compare_each_sequential_sandpod_path_with_each_baseline() -> None:
    latency = {
        "kubectl_sequential": entry(3.0),
        "gateway_sequential": entry(2.0),
        "gateway_concurrency_8": entry(9.0, concurrency=8),
    }
    baselines = {"job": entry(4.0), "pod": {"label": "pod", "summary": None, "error": "boom"}}
    ratios = baseline_ratios(latency, baselines)
    assert ratios["job"] == {"kubectl_sequential": 0.75, "gateway_sequential": 0.5}
    assert ratios["pod"] == {"kubectl_sequential": None, "gateway_sequential": None}


def test_a_failed_measurement_shows_its_error_instead_of_numbers() -> None:
    text = latency_table(
        {
            "broken": {
                "label": "llm-sandbox",
                "summary": None,
                "failures": 5,
                "error": "pod never ran",
            }
        }
    )
    assert "FAILED: pod never ran" in text


def test_render_puts_every_section_in_the_report() -> None:
    slices = [
        {"name": "gVisor sandbox boots", "median_seconds": 0.5, "share": 0.25, "estimated_runs": 0}
    ]
    results = {
        "started_at": "2026-01-01T00:00:00+00:00",
        "options": {"quick": True},
        "machine": {
            "cpu_model": "cpu",
            "cores": 2,
            "memory_gib": 24,
            "kubernetes": "v1.34.4",
            "load_before": "1",
            "load_after": "2",
        },
        "latency": {"kubectl_sequential": entry(3.0, label="sandpod via kubectl")},
        "baselines": {"job": entry(4.0, label="Kubernetes Job")},
        "throughput": {
            "path": "gateway",
            "concurrency": 16,
            "window_seconds": 120.0,
            "executions_per_second": 1.25,
            "requests": 160,
            "succeeded": 150,
            "failed": 10,
            "lost": 0,
            "duplicated": 0,
            "latency": {"p50": 10.0, "p95": 12.0},
        },
        "breakdown": {
            "kubectl": {"slices": slices, "total_seconds": 2.0, "largest": "gVisor sandbox boots"}
        },
        "operator_cost": {
            "executions": 100,
            "cpu_seconds_per_100_executions": 5.0,
            "rss_mib_before": 100,
            "rss_mib_after": 110,
            "peak_rss_mib": 111,
            "api_requests_per_execution": 15.0,
            "operator_counted_requests_per_execution": 9.5,
            "api_requests_per_execution_by_kind": {"create pods": 1.0},
        },
        "notes": ["the machine was busy"],
    }
    text = render(results)
    for expected in (
        "quick run",
        "sandpod via kubectl",
        "0.75x",
        "1.25",
        "gVisor sandbox boots",
        "0.500 (25%)",
        "API requests per execution (all)",
        "create pods",
        "note: the machine was busy",
    ):
        assert expected in text

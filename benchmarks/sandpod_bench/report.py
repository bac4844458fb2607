"""The printed report (pure): a results dict, as written to JSON, to text tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sandpod_bench.soak import ABUSIVE, P99_FACTOR_TARGET, QUIET
from sandpod_bench.stats import ratio

LATENCY_COLUMNS = ("n", "fail", "p50 s", "p95 s", "p99 s", "mean s")
# Issue 22's targets on this machine (2 cores): print(1) in a session via the gateway, runs/s
# across 16 sessions, print(1) from a pool via the gateway, the cold path over a bare pod,
# and the records' API writes per run.
SESSION_P50_TARGET_SECONDS = 0.015
SESSION_P99_TARGET_SECONDS = 0.050
SESSION_THROUGHPUT_TARGET = 100.0
POOL_P50_TARGET_SECONDS = 0.060
COLD_OVER_BARE_POD_TARGET = 1.1
WRITES_PER_RUN_TARGET = 2.0  # of the records (CodeExecutions), for a direct run


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, align_first_left: bool = True
) -> str:
    """A plain text table; the first column left-aligned, the others right-aligned."""
    widths = [len(header) for header in headers]
    for row in rows:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = []
        for index, cell in enumerate(cells):
            if index == 0 and align_first_left:
                parts.append(cell.ljust(widths[index]))
            else:
                parts.append(cell.rjust(widths[index]))
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def seconds(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def latency_cells(entry: Mapping[str, Any] | None) -> list[str]:
    """n, failures, p50, p95, p99, mean of a latency entry; its error if nothing succeeded."""
    if not entry:
        return ["-"] * len(LATENCY_COLUMNS)
    summary = entry.get("summary")
    if not summary:
        error = str(entry.get("error") or "no successful run")
        return ["0", str(entry.get("failures", "-")), f"FAILED: {error[:70]}", "", "", ""]
    return [
        str(summary["count"]),
        str(summary["failures"]),
        seconds(summary["p50"], 3),
        seconds(summary["p95"], 3),
        seconds(summary["p99"], 3),
        seconds(summary["mean"], 3),
    ]


def start_modes(modes: Mapping[str, int] | None) -> str:
    return ", ".join(f"{count} {mode}" for mode, count in sorted((modes or {}).items()))


def latency_table(
    latency: Mapping[str, Mapping[str, Any]], title: str = "sandpod, print(1) end to end"
) -> str:
    rows = []
    for key, entry in latency.items():
        rows.append(
            [entry.get("label", key), *latency_cells(entry), start_modes(entry.get("start_modes"))]
        )
        if entry.get("warm_only"):
            warm = {"summary": entry["warm_only"]}
            rows.append(["  of which the warm runs", *latency_cells(warm), ""])
    return table([title, *LATENCY_COLUMNS, "started"], rows)


def statistic_of(entry: Mapping[str, Any] | None, statistic: str = "p50") -> float | None:
    summary = (entry or {}).get("summary")
    return None if not summary else float(summary[statistic])


def baseline_ratios(
    latency: Mapping[str, Mapping[str, Any]],
    baselines: Mapping[str, Mapping[str, Any]],
    statistic: str = "p50",
) -> dict[str, dict[str, float | None]]:
    """sandpod / baseline (p50 by default), for each sequential sandpod path and baseline."""
    sandpod = {
        key: statistic_of(entry, statistic)
        for key, entry in latency.items()
        if entry.get("concurrency") == 1
    }
    return {
        baseline: {
            path: ratio(value, statistic_of(entry, statistic)) for path, value in sandpod.items()
        }
        for baseline, entry in baselines.items()
    }


def baselines_table(
    latency: Mapping[str, Mapping[str, Any]], baselines: Mapping[str, Mapping[str, Any]]
) -> str:
    ratios = baseline_ratios(latency, baselines)
    paths = [key for key, entry in latency.items() if entry.get("concurrency") == 1]
    short = [str(latency[path].get("path", path)).removeprefix("sandpod-") for path in paths]
    headers = ["baseline, sequential", *LATENCY_COLUMNS, *(f"{name} ÷ it" for name in short)]
    rows = []
    for name, entry in baselines.items():
        rows.append(
            [
                entry.get("label", name),
                *latency_cells(entry),
                *(times(ratios[name][path]) for path in paths),
            ]
        )
    return table(headers, rows)


def throughput_table(throughput: Mapping[str, Any], title: str = "throughput") -> str:
    headers = [title, "value"]
    latency = throughput.get("latency") or {}
    rows = [
        ["path, concurrency", f"{throughput['path']}, {throughput['concurrency']}"],
        ["window", f"{throughput['window_seconds']:.0f} s"],
        ["completed per second", f"{throughput['executions_per_second']:.2f}"],
        ["requests / succeeded", f"{throughput['requests']} / {throughput['succeeded']}"],
        [
            "failed / lost / duplicated",
            f"{throughput['failed']} / {throughput['lost']} / {throughput['duplicated']}",
        ],
        [
            "latency p50 / p95 / p99 under load",
            f"{seconds(latency.get('p50'), 3)} / {seconds(latency.get('p95'), 3)} / "
            f"{seconds(latency.get('p99'), 3)} s",
        ],
    ]
    if throughput.get("unrecorded"):
        rows.append(["  of the lost, answered but never recorded", str(throughput["unrecorded"])])
    if throughput.get("start_modes"):
        rows.append(["started", start_modes(throughput["start_modes"])])
    return table(headers, rows)


def breakdown_table(
    breakdown: Mapping[str, Mapping[str, Any]], title: str = "where the time goes"
) -> str:
    paths = list(breakdown)
    if not paths:
        return ""
    first = breakdown[paths[0]]
    headers = [f"{title} (median s)", *paths]
    rows = []
    for index, item in enumerate(first["slices"]):
        cells = [item["name"]]
        for path in paths:
            slice_ = breakdown[path]["slices"][index]
            marker = "*" if slice_["estimated_runs"] else ""
            cells.append(f"{slice_['median_seconds']:.3f}{marker} ({slice_['share']:.0%})")
        rows.append(cells)
    rows.append(["sum of medians", *(f"{breakdown[p]['total_seconds']:.3f}" for p in paths)])
    rows.append(["largest slice", *(str(breakdown[p]["largest"]) for p in paths)])
    return table(headers, rows)


def verdict(met: bool) -> str:
    return "met" if met else "not met"


def milliseconds(value: float) -> str:
    return f"{value * 1000:.0f} ms"


def runner_durations(breakdown: Mapping[str, Mapping[str, Any]]) -> str:
    """The runner's own durationMs of each breakdown's median run (its record says it)."""
    found = []
    for path, entry in breakdown.items():
        stamps = (entry.get("example") or {}).get("kubernetes_timestamps") or {}
        duration = stamps.get("execution.status.durationMs")
        found.append(f"{path} {'-' if duration is None else f'{duration} ms'}")
    return f"the runner's own durationMs of the median run: {', '.join(found)}"


def targets(results: Mapping[str, Any]) -> list[str]:
    """Issue 22's targets against what was measured (only those measured)."""
    lines = []
    gateway = (results.get("session_latency") or {}).get("session_gateway_sequential")
    for statistic, target in (
        ("p50", SESSION_P50_TARGET_SECONDS),
        ("p99", SESSION_P99_TARGET_SECONDS),
    ):
        value = statistic_of(gateway, statistic)
        if value is not None:
            lines.append(
                f"target: session print(1) via the gateway {statistic} <= "
                f"{milliseconds(target)}: {milliseconds(value)}, {verdict(value <= target)}"
            )
    throughput = results.get("session_throughput")
    if throughput:
        rate = float(throughput["executions_per_second"])
        clean = not (throughput["lost"] or throughput["duplicated"] or throughput["failed"])
        lines.append(
            f"target: >= {SESSION_THROUGHPUT_TARGET:.0f} runs/s across "
            f"{throughput['concurrency']} sessions, none lost, duplicated or failed: "
            f"{rate:.1f}/s, {verdict(rate >= SESSION_THROUGHPUT_TARGET and clean)}"
        )
    pool = statistic_of((results.get("latency") or {}).get("pool_gateway_sequential"))
    if pool is not None:
        lines.append(
            f"target: pool print(1) via the gateway p50 <= {milliseconds(POOL_P50_TARGET_SECONDS)}"
            f": {milliseconds(pool)}, {verdict(pool <= POOL_P50_TARGET_SECONDS)}"
        )
    cold = ((results.get("ratios_p50") or {}).get("pod") or {}).get("gateway_sequential")
    if cold is not None:
        lines.append(
            f"target: cold print(1) via the gateway <= {COLD_OVER_BARE_POD_TARGET}x a bare pod "
            f"(p50): {cold:.2f}x, {verdict(cold <= COLD_OVER_BARE_POD_TARGET)}"
        )
    for key, writes in all_writes(results).items():
        if not key.startswith("session_kubectl"):  # the record path: not a direct run
            # The bench's own watch of its namespace, if it counted them: the API server's
            # counter has the whole cluster's CodeExecutions in it.
            seen = writes.get("records_seen_per_run")
            per_run = float(writes["records_per_run"] if seen is None else seen)
            lines.append(
                f"target: <= {WRITES_PER_RUN_TARGET:.0f} API writes of the records "
                f"(CodeExecutions) per run ({key}): {per_run:.2f}, "
                f"{verdict(per_run <= WRITES_PER_RUN_TARGET)}"
            )
    return lines


def all_writes(results: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The API writes of each session measurement that counted them."""
    writes = {key: entry for key, entry in (results.get("session_writes") or {}).items() if entry}
    throughput = (results.get("session_throughput") or {}).get("api_writes")
    if throughput:
        writes["session_throughput"] = throughput
    return writes


def writes_table(writes: Mapping[str, Mapping[str, Any]]) -> str:
    """API writes per run, as the API server counted them, per measurement; the reads (GET,
    LIST) per run beside them, with those of sandpod's resources."""
    rows = []
    for key, entry in writes.items():
        rows.append(
            [
                key,
                str(entry["runs"]),
                f"{entry['per_run']:.2f}",
                f"{entry['sandpod_per_run']:.2f}",
                f"{entry['records_per_run']:.2f}",
                seconds(entry.get("records_seen_per_run")),
                f"{entry['reads_per_run']:.2f}",
            ]
        )
        for kind, per_run in entry["by_kind"].items():
            rows.append([f"  {kind}", "", f"{per_run:.2f}", "", "", "", ""])
        for kind, per_run in entry["sandpod_reads_by_kind"].items():
            rows.append([f"  {kind}", "", "", "", "", "", f"{per_run:.2f}"])
    headers = [
        "API requests per run (apiserver_request_total)",
        "runs",
        "writes",
        "sandpod.dev",
        "records",
        "seen",
        "reads",
    ]
    return table(headers, rows)


def cost_table(cost: Mapping[str, Any]) -> str:
    own = cost.get("operator_counted_requests_per_execution")
    rows = [
        ["executions", str(cost["executions"])],
        ["CPU seconds per 100 executions", f"{cost['cpu_seconds_per_100_executions']:.2f}"],
        ["RSS before / after (MiB)", f"{cost['rss_mib_before']:.0f} / {cost['rss_mib_after']:.0f}"],
        ["peak RSS (MiB)", f"{cost['peak_rss_mib']:.0f}"],
        ["API requests per execution (all)", f"{cost['api_requests_per_execution']:.1f}"],
        ["  of which the operator's own count", "-" if own is None else f"{own:.1f}"],
    ]
    for kind, value in sorted(
        cost["api_requests_per_execution_by_kind"].items(), key=lambda item: -item[1]
    )[:8]:
        rows.append([f"  {kind}", f"{value:.2f}"])
    return table(["operator cost", "value"], rows)


def phase_cells(summary: Mapping[str, Any]) -> list[str]:
    """n (and failures), p50, p99 of one phase of a soak row."""
    failures = summary.get("failures") or 0
    count = f"{summary.get('count', 0)}" + (f" ({failures} failed)" if failures else "")
    return [count, seconds(summary.get("p50"), 3), seconds(summary.get("p99"), 3)]


def soak_latency_table(rows: Sequence[Mapping[str, Any]]) -> str:
    headers = [
        "soak: the quiet tenants (s)",
        "quiet n",
        "p50",
        "p99",
        "abusive n",
        "p50",
        "p99",
        "p99 x",
    ]
    cells = [
        [
            f"{row['tenant']}, {row['kind']}",
            *phase_cells(row[QUIET]),
            *phase_cells(row[ABUSIVE]),
            times(row.get("p99_ratio")),
        ]
        for row in rows
    ]
    return table(headers, cells)


def soak_target(rows: Sequence[Mapping[str, Any]]) -> str:
    """Issue 26's target: the quiet tenants' p99 within 2x of the quiet phase's, per kind."""
    missed = [f"{r['tenant']}, {r['kind']}" for r in rows if r.get("p99_within_target") is False]
    unknown = [f"{r['tenant']}, {r['kind']}" for r in rows if r.get("p99_within_target") is None]
    text = (
        f"target: the quiet tenants' p99 within {P99_FACTOR_TARGET:g}x of the quiet phase's "
        f"while the other tenant abuses: {verdict(not missed and not unknown)}"
    )
    if missed:
        text += f" (beyond for {'; '.join(missed)})"
    if unknown:
        text += f" (not measured for {'; '.join(unknown)})"
    return text


def soak_audit_table(audits: Mapping[str, Mapping[str, Any]]) -> str:
    rows = [
        [
            tenant,
            str(found["requests"]),
            str(found["succeeded"]),
            str(found["failed"]),
            str(found["lost"]),
            str(found["duplicated"]),
        ]
        for tenant, found in audits.items()
    ]
    return table(
        ["soak: every create, audited", "requests", "ok", "failed", "lost", "duplicated"], rows
    )


def soak_answers_table(answers: Mapping[str, Mapping[str, int]]) -> str:
    rows = []
    for behaviour, outcomes in answers.items():
        for index, (answer, count) in enumerate(outcomes.items()):
            rows.append([behaviour if index == 0 else "", answer, str(count)])
    return table(["soak: the abusive tenant's requests", "answer", "count"], rows)


def resource_value(series: str, value: float | None) -> str:
    if value is None:
        return "-"
    if series.endswith("_bytes"):
        return f"{value / 1024 / 1024:.1f} MiB"
    return f"{value:.0f}"


def soak_resources_table(resources: Mapping[str, Mapping[str, Any] | None]) -> str:
    rows = []
    for series, found in resources.items():
        if not found:
            rows.append([series, "not read", "", "", "", "", ""])
            continue
        fraction = found.get("change_fraction")
        rows.append(
            [
                series,
                resource_value(series, found["start"]),
                resource_value(series, found["end"]),
                resource_value(series, found["peak"]),
                "-" if fraction is None else f"{fraction:+.0%}",
                resource_value(series, found.get("per_minute")),
                resource_value(series, found.get("last_third_per_minute")),
            ]
        )
    columns = ["start", "end", "peak", "change", "per min", "per min, last third"]
    return table(["soak: size over the run", *columns], rows)


def soak_report(soak: Mapping[str, Any]) -> list[str]:
    return [
        "",
        f"soak: {soak['minutes']:g} min, tenant {soak['abusive_tenant']} abusive from minute "
        f"{soak['quiet_minutes']:g}",
        soak_latency_table(soak["kinds"]),
        soak_target(soak["kinds"]),
        *(
            f"started: {key}: {start_modes(modes)}"
            for key, modes in (soak.get("start_modes") or {}).items()
        ),
        "",
        soak_audit_table(soak["audit"]),
        "",
        soak_answers_table(soak["abusive_answers"]),
        "",
        soak_resources_table(soak["resources"]),
    ]


def render(results: Mapping[str, Any]) -> str:
    machine = results.get("machine") or {}
    parts = [
        f"sandpod benchmark {results.get('started_at', '')} "
        f"({'quick' if results.get('options', {}).get('quick') else 'full'} run)",
        f"machine: {machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores, "
        f"{machine.get('memory_gib', '?')} GiB, Kubernetes {machine.get('kubernetes', '?')}, "
        f"load average {machine.get('load_before', '?')} before, "
        f"{machine.get('load_after', '?')} after",
    ]
    if results.get("latency"):
        parts += ["", latency_table(results["latency"])]
    if results.get("baselines"):
        parts += [
            "",
            baselines_table(results.get("latency") or {}, results["baselines"]),
            "÷ it: sandpod's sequential p50 through kubectl / the gateway over the baseline's",
        ]
    if results.get("throughput"):
        parts += ["", throughput_table(results["throughput"])]
    if results.get("pool_throughput"):
        parts += ["", throughput_table(results["pool_throughput"], "throughput with a pool")]
    if results.get("breakdown"):
        parts += [
            "",
            breakdown_table(results["breakdown"]),
            "* some runs lacked this milestone; it took the next one's time",
        ]
    if results.get("pool_breakdown"):
        parts += ["", breakdown_table(results["pool_breakdown"], "where the warm time goes")]
    if results.get("session_latency"):
        parts += ["", latency_table(results["session_latency"], "print(1) in a session")]
    if results.get("e2b_latency"):
        parts += ["", latency_table(results["e2b_latency"], "E2B's SDKs, beside a sandpod session")]
    if results.get("session_throughput"):
        parts += ["", throughput_table(results["session_throughput"], "throughput in sessions")]
    writes = all_writes(results)
    if writes:
        parts += [
            "",
            writes_table(writes),
            "the API server counts the whole cluster's requests, other activity included; "
            "seen: the records' writes as the bench's watch of its namespace saw them",
        ]
    if results.get("session_breakdown"):
        parts += ["", breakdown_table(results["session_breakdown"], "where a session run goes")]
    if results.get("direct_breakdown"):
        parts += [
            "",
            breakdown_table(results["direct_breakdown"], "where a direct run's time goes"),
            runner_durations(results["direct_breakdown"]),
        ]
    parts += targets(results)
    if results.get("soak"):
        parts += soak_report(results["soak"])
    if results.get("operator_cost"):
        parts += ["", cost_table(results["operator_cost"])]
    main_operator = results.get("main_operator")
    if main_operator:
        parts.append(
            f"the latency/throughput operator: {main_operator['executions']} executions, "
            f"{main_operator['cpu_seconds_per_100_executions']:.2f} CPU s per 100, "
            f"peak RSS {main_operator['peak_rss_mib']:.0f} MiB"
        )
    for note in results.get("notes") or []:
        parts.append(f"note: {note}")
    return "\n".join(parts)

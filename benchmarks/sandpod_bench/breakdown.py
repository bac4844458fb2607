"""Where the time of one execution goes (pure): milestones observed by the bench client,
turned into consecutive slices.

Every milestone is a wall-clock time (seconds since the epoch) at which the bench saw it:
its own call times, and the arrival times of watch events on the CodeExecution and its pod.
Kubernetes' own timestamps have 1-second granularity, too coarse for slices of a few hundred
milliseconds; they are kept beside the slices for reference (`kubernetes_timestamps`).

A warm execution (a pod claimed from a SandboxPool) has milestones of its own (`WARM`): no pod
starts for it, and the runner is reached over HTTP, whose times come from the operator's
"warm timings" log line (same machine, same wall clock).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandpod_bench.stats import median

# (milestone, what it is), in the order they happen to one execution. The containerd ones
# come from its event stream (nanoseconds); the others are arrival times of watch events.
MILESTONES: tuple[tuple[str, str], ...] = (
    ("submitted", "the client starts its request (kubectl starts, or the HTTP request is sent)"),
    ("created", "the CodeExecution's ADDED watch event arrives"),
    ("operator_seen", "the first change the operator makes to it (its finalizer) arrives"),
    ("pod_created", "the sandbox pod's ADDED watch event arrives"),
    ("pod_scheduled", "the pod is bound to the node (its PodScheduled condition arrives)"),
    (
        "sandbox_created",
        "containerd creates the pod's sandbox (kubelet picked the pod up, pod network set up)",
    ),
    ("sandbox_started", "the gVisor sandbox is running (containerd: sandbox task started)"),
    ("runner_started", "the runner's container has started (containerd: task started)"),
    ("program_exited", "the runner has exited (containerd: task exit)"),
    ("exit_reported", "the pod's terminated container state arrives (kubelet status update)"),
    ("status_written", "the terminal status of the CodeExecution arrives"),
    ("client_returned", "the client has the result (kubectl wait exits, HTTP response)"),
)
MILESTONE_NAMES = tuple(name for name, _ in MILESTONES)


def _from_the_ends(*middle: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """Milestones between the bench's own two ends: its client and its watch."""
    return (
        ("submitted", "the client starts its request"),
        ("created", "the CodeExecution's ADDED watch event arrives"),
        *middle,
        ("status_written", "the terminal status of the CodeExecution arrives (bench's watch)"),
        ("client_returned", "the client has the result (kubectl wait exits, HTTP response)"),
    )


def _slices_from_the_ends(status_written: str, **middle: str) -> dict[str, str]:
    """Slice names for `_from_the_ends` milestones: the slice that ends at each one."""
    return {
        "created": "create: client to API server",
        **middle,
        "status_written": status_written,
        "client_returned": "client sees the result",
    }


# A warm run. The operator's marks are the `op_*` ones.
WARM_MILESTONES = _from_the_ends(
    ("op_claiming", "the operator's create handler starts the claim (operator log)"),
    ("op_claimed", "the operator's claim patch of a pool pod returned (operator log)"),
    ("op_running", "the operator's status write Running returned (operator log)"),
    ("op_posted", "the operator sends POST /v1/run to the runner (operator log)"),
    ("op_first_frame", "the first bytes of the runner's answer arrive (operator log)"),
    ("op_summary", "the runner's summary arrives (operator log)"),
)
WARM_MILESTONE_NAMES = tuple(name for name, _ in WARM_MILESTONES)
WARM_SLICE_NAMES = _slices_from_the_ends(
    "verify, terminal status written and seen",
    op_claiming="operator sees it, finalizer, create handler",
    op_claimed="claim: patch a free pod (from the index)",
    op_running="status write Running",
    op_posted="start the run (task, credential, request)",
    op_first_frame="runner: start the program, first frame",
    op_summary="program ends, summary",
)

# A run of the direct path (in a session, or in a free pool pod, through the gateway): the
# gateway posts it to the operator, which runs it on the runner and answers; its record is
# written behind, so the bench's watch has nothing on the way. The `op_*` marks are the
# operator's `direct timings` line.
DIRECT_MILESTONES: tuple[tuple[str, str], ...] = (
    ("submitted", "the client starts its request"),
    ("op_received", "the operator has the run (direct timings: received)"),
    ("op_turn", "its turn has come: the session's queue let it through, or a pool pod was taken"),
    ("op_posted", "the operator sends POST /v1/run to the runner"),
    ("op_first_frame", "the first bytes of the runner's answer arrive"),
    ("op_summary", "the runner's summary arrives"),
    ("op_done", "the operator has its answer: verified, the verdict made (outputs stored)"),
    ("client_returned", "the client has the result (HTTP response, MCP tool result)"),
)
DIRECT_MILESTONE_NAMES = tuple(name for name, _ in DIRECT_MILESTONES)
DIRECT_SLICE_NAMES = {
    "op_received": "client sends; gateway: auth, admission, post to the operator",
    "op_turn": "operator: session queue / take a pool pod",
    "op_posted": "operator: run request to the runner",
    "op_first_frame": "runner: start the program, first frame",
    "op_summary": "program ends, summary",
    "op_done": "operator: verify, verdict",
    "client_returned": "operator answers, gateway answers, client",
}

# A run in a session through kubectl (the record path): no pod starts and the operator logs
# no timings for it, so what the bench's watch sees is all there is (the runner's durationMs
# is in the example).
SESSION_SLICE_NAMES = _slices_from_the_ends(
    "run: POST to the runner, print(1), summary, terminal status",
    operator_seen="operator sees it (kopf's finalizer)",
    running="operator: session queue, status write Running",
)
SESSION_MILESTONES = _from_the_ends(
    ("operator_seen", "the first change the operator makes to it (its finalizer) arrives"),
    ("running", "its status Running (the session's pod named) arrives"),
)
SESSION_MILESTONE_NAMES = tuple(name for name, _ in SESSION_MILESTONES)

# The slice that ends at a milestone, named for what happened in it.
SLICE_NAMES: dict[str, str] = {
    "created": "create: client to API server",
    "operator_seen": "operator sees it",
    "pod_created": "operator creates ConfigMap, policy, pod",
    "pod_scheduled": "scheduler binds the pod",
    "sandbox_created": "kubelet: pod network, sandbox container",
    "sandbox_started": "gVisor sandbox boots",
    "runner_started": "runner container starts",
    "program_exited": "runner + print(1) run",
    "exit_reported": "kubelet reports the exit",
    "status_written": "operator reads log, writes status",
    "client_returned": "client sees the result",
}


# The milestones and slice names of each kind of run a breakdown divides: a cold one-off run,
# a warm one of the record path (operator marks), a session run of the record path, and a
# run of the direct path (operator marks).
KINDS: dict[str, tuple[tuple[str, ...], Mapping[str, str]]] = {
    "cold": (MILESTONE_NAMES, SLICE_NAMES),
    "warm": (WARM_MILESTONE_NAMES, WARM_SLICE_NAMES),
    "session": (SESSION_MILESTONE_NAMES, SESSION_SLICE_NAMES),
    "direct": (DIRECT_MILESTONE_NAMES, DIRECT_SLICE_NAMES),
}


@dataclass(frozen=True)
class Slice:
    milestone: str
    name: str
    seconds: float
    estimated: bool  # an endpoint was not observed and borrowed its neighbour's time


def slices(
    timeline: Mapping[str, float],
    names: Sequence[str] = MILESTONE_NAMES,
    slice_names: Mapping[str, str] = SLICE_NAMES,
) -> list[Slice]:
    """Consecutive slices between milestones. A milestone that was not observed (e.g. a pod
    that went from Pending straight to terminated between two kubelet status updates) takes
    the time of the next one that was, so that the slices always add up to the total; such
    slices are marked `estimated`. Needs `submitted` and `client_returned`."""
    if "submitted" not in timeline or "client_returned" not in timeline:
        raise ValueError("a timeline needs at least submitted and client_returned")
    filled: dict[str, float] = {}
    missing: set[str] = set()
    later = timeline["client_returned"]
    for name in reversed(names):
        if name in timeline:
            # Watch events arrive in order per object, but the CR and pod watches are two
            # streams: never let a slice go negative.
            later = min(later, timeline[name])
            filled[name] = later
        else:
            filled[name] = later
            missing.add(name)
    result = []
    for previous, current in itertools.pairwise(names):
        result.append(
            Slice(
                milestone=current,
                name=slice_names[current],
                seconds=filled[current] - filled[previous],
                estimated=current in missing or previous in missing,
            )
        )
    return result


@dataclass(frozen=True)
class SliceSummary:
    milestone: str
    name: str
    median_seconds: float
    share: float  # of the sum of medians
    estimated_runs: int


def summarize_slices(runs: Sequence[Sequence[Slice]]) -> list[SliceSummary]:
    """Median of each slice over several runs, with its share of the whole."""
    if not runs:
        return []
    names = {s.milestone: s.name for s in runs[0]}
    medians = {
        milestone: median(
            [
                run_slice.seconds
                for run in runs
                for run_slice in run
                if run_slice.milestone == milestone
            ]
        )
        for milestone in names
    }
    total = sum(medians.values())
    return [
        SliceSummary(
            milestone=milestone,
            name=names[milestone],
            median_seconds=medians[milestone],
            share=medians[milestone] / total if total > 0 else 0.0,
            estimated_runs=sum(
                1 for run in runs for s in run if s.milestone == milestone and s.estimated
            ),
        )
        for milestone in names
    ]


def largest(summaries: Sequence[SliceSummary]) -> SliceSummary | None:
    return max(summaries, key=lambda s: s.median_seconds, default=None)


def kubernetes_timestamps(
    execution: Mapping[str, Any] | None, pod: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The timestamps Kubernetes and sandpod themselves record (1 s granularity for the
    API server's and kubelet's), for one execution and its last seen pod."""
    found: dict[str, Any] = {}
    if execution:
        status = execution.get("status") or {}
        found["execution.creationTimestamp"] = execution.get("metadata", {}).get(
            "creationTimestamp"
        )
        for key in ("startedAt", "finishedAt", "durationMs", "phase"):
            if key in status:
                found[f"execution.status.{key}"] = status[key]
    if pod:
        found["pod.creationTimestamp"] = pod.get("metadata", {}).get("creationTimestamp")
        for condition in (pod.get("status") or {}).get("conditions") or []:
            found[f"pod.condition.{condition.get('type')}"] = condition.get("lastTransitionTime")
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            state = container.get("state") or {}
            terminated = state.get("terminated") or {}
            running = state.get("running") or {}
            if running.get("startedAt"):
                found["pod.container.startedAt"] = running["startedAt"]
            if terminated:
                found["pod.container.startedAt"] = terminated.get("startedAt")
                found["pod.container.finishedAt"] = terminated.get("finishedAt")
    return found

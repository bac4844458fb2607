"""Pure status derivation: what a sandbox pod (and the runner's report) says -> CR status.

`observe_pod` turns a pod (a plain dict as the API returns it) into a Verdict, and
`next_status` folds a Verdict into the previous status, keeping conditions' transition
times and never moving backwards (a terminal status is final).
"""

import signal as signals
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from pydantic import ValidationError
from sandpod_contract.models import (
    COMPILATION_ERROR,
    BlockedEgress,
    CodeExecutionStatus,
    Condition,
    Diagnostic,
    OutputFileStatus,
    Phase,
    ReportedBy,
    format_time,
    is_terminal,
    parse_time,
)
from sandpod_contract.names import CANCEL_ANNOTATION
from sandpod_contract.quantities import byte_quantity, parse_quantity
from sandpod_contract.runner import (
    CompileResult,
    LogSummary,
    RunnerResult,
    Summary,
    VerifiedFile,
    json_size,
    parse_summary,
)

from sandpod_operator.kube import Manifest as Pod
from sandpod_operator.settings import OperatorSettings

Status = dict[str, Any]

IMAGE_ERRORS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "ImageInspectError",
        "RegistryUnavailable",
    }
)
CONFIG_ERRORS = frozenset({"CreateContainerConfigError"})
START_ERRORS = frozenset({"StartError", "ContainerCannotRun"})
QUEUED = "Queued"
# An execution waiting for its session (executions before it run first); Queued as well.
WAITING_FOR_SESSION = "WaitingForSession"
TIMEOUT_EXIT_CODE = 124
SIGKILL = 9
# A process killed by signal N exits (as seen by its parent, here the kubelet) with 128 + N.
SIGNAL_EXIT_BASE = 128
# A run killed by SIGKILL that had come this close to its memory limit ran out of memory.
OOM_NEAR_LIMIT = 0.9

# Status messages are the platform's sentences; a long one (an API error) is cut here.
MAX_MESSAGE_CHARS = 1024

StartMode = Literal["warm", "cold"]

_PHASE_RANK = {"Pending": 0, "Running": 1}
_TERMINAL_RANK = 2


@dataclass(frozen=True)
class Verdict:
    """What the operator concludes about an execution at one moment."""

    phase: Phase
    reason: str
    message: str = ""
    retryable: bool | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    signal: int | None = None
    duration_ms: int | None = None
    peak_memory_bytes: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    stdout_truncated: bool | None = None
    stderr_truncated: bool | None = None
    diagnostics: list[dict[str, Any]] | None = field(default=None)
    compile_output: str | None = None
    compile_output_truncated: bool | None = None
    start_mode: StartMode | None = None
    wait_ms: int | None = None
    session: str | None = None
    result: str | None = None
    state_lost: bool | None = None
    reported_by: ReportedBy | None = None
    # The verified output files (with their bytes) until the reconciler stores them and
    # sets `outputs` (their status entries).
    files: tuple[VerifiedFile, ...] = ()
    outputs: list[dict[str, Any]] | None = None
    outputs_config_map: str | None = None
    outputs_truncated: bool | None = None

    @property
    def terminal(self) -> bool:
        return is_terminal(self.phase)


def _container_status(pod: Pod) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def _condition(pod: Pod, kind: str) -> dict[str, Any]:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def terminated_state(pod: Pod) -> dict[str, Any] | None:
    """The sandbox container's terminated state, once it has one."""
    state = _container_status(pod).get("state") or {}
    terminated = state.get("terminated")
    return dict(terminated) if isinstance(terminated, dict) else None


def pod_finished(pod: Pod) -> bool:
    """The pod will not change any more: its container ended, or the pod itself did."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed") or terminated_state(pod) is not None


def pod_state_key(pod: Pod) -> tuple[str, ...]:
    """The part of a pod's state that can change a verdict; equal keys need no second look.

    Pending sub-steps (scheduled, creating the container) are deliberately one state: each
    would cost a read and a write per execution for no change of phase.
    """
    pod_status = pod.get("status") or {}
    if pod_finished(pod):
        terminated = terminated_state(pod) or {}
        return (
            "finished",
            str(pod_status.get("phase")),
            str(terminated.get("reason")),
            str(pod_status.get("reason")),
        )
    state = _container_status(pod).get("state") or {}
    if "running" in state:
        return ("running",)
    waiting_reason = str((state.get("waiting") or {}).get("reason") or "")
    if waiting_reason in IMAGE_ERRORS | CONFIG_ERRORS:
        return ("failing", waiting_reason)
    scheduled = _condition(pod, "PodScheduled")
    if scheduled.get("reason") == "Unschedulable":
        return ("unschedulable",)
    return ("pending",)


def _memory_limit_bytes(pod: Pod) -> int | None:
    containers = (pod.get("spec") or {}).get("containers") or []
    limit = (
        ((containers[0].get("resources") or {}).get("limits") or {}).get("memory")
        if containers
        else None
    )
    try:
        return int(parse_quantity(str(limit))) if limit is not None else None
    except ValueError:
        return None


def _signal_name(signal: int) -> str:
    try:
        return signals.Signals(signal).name
    except ValueError:
        return f"signal {signal}"


@dataclass(frozen=True)
class NodeRoom:
    """What the largest node can give one pod (its allocatable cpu and memory)."""

    cpu: Decimal
    memory: Decimal

    @classmethod
    def largest(cls, allocatables: Iterable[Mapping[str, Any]]) -> "NodeRoom | None":
        rooms = [
            cls(parse_quantity(str(a.get("cpu", 0))), parse_quantity(str(a.get("memory", 0))))
            for a in allocatables
        ]
        if not rooms:
            return None
        return cls(max(r.cpu for r in rooms), max(r.memory for r in rooms))


@dataclass(frozen=True)
class NodeView:
    """What the operator knows of the nodes when it judges a pod that has not started: the
    largest node's room (a pod asking more can never run) and when a sandbox on the pod's
    node last took a step toward its program (node_step_at: a busy node, not a stuck one)."""

    largest: NodeRoom | None = None
    last_step: datetime | None = None


def _requests(pod: Pod) -> NodeRoom:
    containers = (pod.get("spec") or {}).get("containers") or []
    requests = ((containers[0].get("resources") or {}).get("requests") or {}) if containers else {}
    return NodeRoom(
        parse_quantity(str(requests.get("cpu", 0))), parse_quantity(str(requests.get("memory", 0)))
    )


def observe_queued(
    pod: Pod,
    scheduled: Mapping[str, Any],
    now: datetime,
    settings: OperatorSettings,
    largest_node: NodeRoom | None,
) -> Verdict:
    """A pod no node can take now: it waits for room (Pending/Queued) unless it could never
    fit the largest node or has waited `queue_timeout_seconds`."""
    scheduler_says = str(scheduled.get("message") or "no node can run the sandbox")
    needs = _requests(pod)
    if largest_node is not None and (
        needs.cpu > largest_node.cpu or needs.memory > largest_node.memory
    ):
        return Verdict(
            phase="Error",
            reason="Unschedulable",
            message=f"the sandbox asks for more than any node has ({scheduler_says})",
            retryable=False,
            finished_at=now,
        )
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp")) or now
    if (now - created).total_seconds() >= settings.queue_timeout_seconds:
        return Verdict(
            phase="Error",
            reason="Unschedulable",
            message=f"no node had room for the sandbox within "
            f"{settings.queue_timeout_seconds}s ({scheduler_says})",
            retryable=True,
            finished_at=now,
        )
    return Verdict(
        phase="Pending",
        reason=QUEUED,
        message=f"waiting for room on a node ({scheduler_says})",
    )


# A pod's steps toward a running program, in order: each one restarts the startup clock, so
# that a busy node (a burst of sandboxes) is slow, not stuck. Time queued for a node does not
# count (PodScheduled); the node creating the sandbox, its network and volumes does, until the
# pod is ready to start containers; then the container's creation and start.
STARTUP_STEPS = ("PodScheduled", "PodReadyToStartContainers", "Initialized")


def startup_step_at(pod: Pod, now: datetime) -> datetime:
    """When the pod took its last step toward a running program (its creation at first)."""
    since = parse_time((pod.get("metadata") or {}).get("creationTimestamp")) or now
    for step in STARTUP_STEPS:
        condition = _condition(pod, step)
        if condition.get("status") == "True":
            since = max(since, parse_time(condition.get("lastTransitionTime")) or since)
    return since


def node_step_at(pod: Pod) -> tuple[str, datetime] | None:
    """(its node, when it last took a step there: a startup step or its program's start), for
    a pod placed on a node. A node whose sandboxes take steps is busy starting them, not stuck:
    the startup clock of each pod waiting there counts from the node's last step too."""
    node = (pod.get("spec") or {}).get("nodeName")
    scheduled = _condition(pod, "PodScheduled")
    scheduled_at = parse_time(scheduled.get("lastTransitionTime"))
    if not node or scheduled.get("status") != "True" or scheduled_at is None:
        return None
    at = startup_step_at(pod, scheduled_at)
    state = _container_status(pod).get("state") or {}
    for reached in ("running", "terminated"):
        started = parse_time((state.get(reached) or {}).get("startedAt"))
        if started is not None:
            at = max(at, started)
    return str(node), at


def observe_pending(
    pod: Pod, now: datetime, settings: OperatorSettings, nodes: NodeView = NodeView()
) -> Verdict:
    """A pod whose program has not started: still Pending, or a verdict that it never will."""
    waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
    waiting_reason = str(waiting.get("reason") or "")
    waiting_message = str(waiting.get("message") or "")
    image = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("image", "")
    if waiting_reason in IMAGE_ERRORS:
        detail = f"{waiting_reason}: {waiting_message}" if waiting_message else waiting_reason
        return Verdict(
            phase="Error",
            reason="ImageNotFound",
            message=f"image {image} is not available on the node ({detail})",
            retryable=False,
            finished_at=now,
        )
    if waiting_reason in CONFIG_ERRORS:
        return Verdict(
            phase="Error",
            reason="ContainerConfigError",
            message=waiting_message or waiting_reason,
            retryable=False,
            finished_at=now,
        )
    scheduled = _condition(pod, "PodScheduled")
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return observe_queued(pod, scheduled, now, settings, nodes.largest)
    since = startup_step_at(pod, now)
    if nodes.last_step is not None:
        since = max(since, nodes.last_step)
    if (now - since).total_seconds() >= settings.pod_startup_timeout_seconds:
        detail = f" (last: {waiting_reason}: {waiting_message})" if waiting_reason else ""
        return Verdict(
            phase="Error",
            reason="StartupTimeout",
            message=f"the sandbox did not start within {settings.pod_startup_timeout_seconds}s"
            " of its last step" + detail,
            retryable=True,
            finished_at=now,
        )
    if waiting_reason:
        return Verdict(phase="Pending", reason=waiting_reason, message=waiting_message)
    if scheduled.get("status") == "True":
        return Verdict(phase="Pending", reason="Scheduled", message="starting the sandbox")
    return Verdict(phase="Pending", reason="PodCreated", message="waiting for a node")


def accepted_summary(pod: Pod) -> Summary | None:
    """The runner's summary, only if the kubelet saw the runner exit 0: it does so only
    after writing it. Any other exit leaves the termination message to whatever the
    program wrote there."""
    terminated = terminated_state(pod) or {}
    exit_code = terminated.get("exitCode")
    if not isinstance(exit_code, int) or isinstance(exit_code, bool) or exit_code != 0:
        return None
    return parse_summary(terminated.get("message"))


def _accepted_result(pod: Pod, log: LogSummary | None) -> RunnerResult | None:
    """The result the runner reported: from the verified log, or from the termination
    message alone when the log could not be read (exit 0 makes it the runner's last word)."""
    summary = accepted_summary(pod)
    if summary is None:
        return None
    return summary.result if log is None else log.result


def _output_fields(
    log: LogSummary | None, result: RunnerResult, settings: OperatorSettings
) -> dict[str, Any]:
    fields = _compile_fields(result.compile, settings.status_output_bytes)
    if result.value is not None:
        # The trailing expression's repr, as the program's interpreter reported it.
        fields["result"] = head_within(result.value, settings.status_output_bytes)
    listed = bool(result.outputs)
    if log is None:
        return {
            **fields,
            "stdout_truncated": result.stdout_truncated,
            "stderr_truncated": result.stderr_truncated,
            # Listed files whose bytes were in the unreadable log are lost.
            "outputs_truncated": (result.outputs_truncated or listed) or None,
        }
    return {
        **fields,
        "stdout": log.stdout,
        "stderr": log.stderr,
        "stdout_truncated": log.stdout_clipped or result.stdout_truncated,
        "stderr_truncated": log.stderr_clipped or result.stderr_truncated,
        "files": log.files,
        "outputs_truncated": (result.outputs_truncated or log.dropped_files > 0) or None,
    }


def _reported_fields(result: RunnerResult) -> dict[str, Any]:
    """What the runner's result says of the program, and whose word that is: the runner's
    own observation, or a session kernel's answer (docs/runner-protocol.md, "A session is
    one trust domain")."""
    return {
        "exit_code": result.exit_code,
        "signal": result.signal,
        "duration_ms": result.duration_ms,
        "peak_memory_bytes": result.peak_memory_bytes,
        "reported_by": "sessionKernel" if result.kernel else "runner",
    }


def _compile_fields(compiled: CompileResult | None, limit: int) -> dict[str, Any]:
    """The compiler's output, its head within `limit` bytes as stored (compilers report
    the first error first)."""
    if compiled is None:
        return {}
    output = head_within(compiled.output, limit)
    truncated = compiled.output_truncated or len(output) < len(compiled.output)
    return {"compile_output": output, "compile_output_truncated": truncated}


def head_within(text: str, limit: int) -> str:
    """The longest start of `text` that takes at most `limit` bytes JSON-encoded."""
    if json_size(text) <= limit:
        return text
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if json_size(text[:middle]) <= limit:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _finished_base(
    terminated: dict[str, Any],
    log: LogSummary | None,
    result: RunnerResult | None,
    now: datetime,
    settings: OperatorSettings,
) -> dict[str, Any]:
    """Times and output: the runner's when it reported, else only what the kubelet saw."""
    started_at = parse_time(terminated.get("startedAt"))
    finished_at = parse_time(terminated.get("finishedAt")) or now
    base: dict[str, Any] = {"started_at": started_at, "finished_at": finished_at}
    if result is not None:
        base.update(_output_fields(log, result, settings))
        base.update(_reported_fields(result))
    elif started_at is not None:
        base["duration_ms"] = int((finished_at - started_at).total_seconds() * 1000)
    return base


def observe_finished(
    pod: Pod,
    log: LogSummary | None,
    *,
    mode: str,
    timeout_seconds: int,
    now: datetime,
    settings: OperatorSettings,
) -> Verdict:
    """A pod that ended: the kubelet's verdicts first, then the runner's verified report."""
    terminated = terminated_state(pod) or {}
    result = _accepted_result(pod, log)
    base = _finished_base(terminated, log, result, now, settings)
    platform = _platform_verdict(pod, result, base, settings, timeout_seconds)
    if platform is not None:
        return platform
    if result is None:
        return Verdict(
            phase="Error",
            reason="NoResult",
            message=_no_result_message(terminated, log),
            retryable=True,
            **base,
        )
    return _runner_verdict(result, mode, base, settings.max_diagnostics)


def _platform_verdict(
    pod: Pod,
    result: RunnerResult | None,
    base: dict[str, Any],
    settings: OperatorSettings,
    timeout_seconds: int,
) -> Verdict | None:
    """What Kubernetes itself saw end the sandbox, if anything did (never program text)."""
    verdict = _pod_ended(pod, result, base) or _out_of_memory(pod, result, base, settings)
    if verdict is None and result is None:
        verdict = _ended_without_runner(pod, base, settings, timeout_seconds)
    return verdict


def _pod_ended(pod: Pod, result: RunnerResult | None, base: dict[str, Any]) -> Verdict | None:
    """The pod's own end: its deadline, or an eviction (with the kubelet's sentence)."""
    pod_status = pod.get("status") or {}
    pod_reason = str(pod_status.get("reason") or "")
    if pod_reason == "DeadlineExceeded":
        if base["started_at"] is None and result is None:
            return Verdict(
                phase="Error",
                reason="StartupTimeout",
                message="the sandbox never started before the pod's deadline",
                retryable=True,
                **base,
            )
        return Verdict(
            phase="TimedOut",
            reason="DeadlineExceeded",
            message="the sandbox outlived its deadline and was stopped by Kubernetes",
            retryable=False,
            **base,
        )
    if pod_reason != "Evicted":
        return None
    pod_message = str(pod_status.get("message") or "")
    if "ephemeral" in pod_message.lower() or "emptydir" in pod_message.lower():
        return Verdict(
            phase="Failed",
            reason="StorageLimitExceeded",
            message=pod_message,
            retryable=False,
            **base,
        )
    return Verdict(phase="Error", reason="Evicted", message=pod_message, retryable=True, **base)


def _out_of_memory(
    pod: Pod, result: RunnerResult | None, base: dict[str, Any], settings: OperatorSettings
) -> Verdict | None:
    """The run held more memory than its limit: the runner ended it there (memoryExceeded,
    naming the limit), or else the kernel killed the program or the whole sandbox."""
    if result is not None and result.memory_exceeded:
        limit = result.memory_limit_bytes
        limit_text = "?" if limit is None else byte_quantity(limit)
    else:
        terminated = terminated_state(pod) or {}
        if terminated.get("reason") != "OOMKilled" and not _ran_out_of_memory(
            pod, result, settings
        ):
            return None
        limit_text = _memory_limit_text(pod, settings)
    return Verdict(
        phase="Failed",
        reason="OOMKilled",
        message=f"the program exceeded its memory limit of {limit_text} and was killed",
        retryable=False,
        # Killed, not exited: whatever exit code the container got is not the program's.
        **{**base, "exit_code": None, "signal": base.get("signal") or SIGKILL},
    )


def _ended_without_runner(
    pod: Pod, base: dict[str, Any], settings: OperatorSettings, timeout_seconds: int
) -> Verdict | None:
    """No result: the runner never started, or the run outlived the operator's deadline."""
    reason = (terminated_state(pod) or {}).get("reason")
    if reason in START_ERRORS:
        return Verdict(
            phase="Error",
            reason="ContainerStartFailed",
            message=f"the sandbox container could not start ({reason})",
            retryable=False,
            **base,
        )
    started_at, finished_at = base["started_at"], base["finished_at"]
    if started_at is not None and finished_at >= run_deadline(
        started_at, timeout_seconds, settings
    ):
        return timed_out_by_platform(timeout_seconds, base)
    return None


def observe_served(
    pod: Pod,
    log: LogSummary,
    *,
    mode: str,
    started_at: datetime,
    now: datetime,
    settings: OperatorSettings,
) -> Verdict:
    """A serving runner's answer (warm path), verified: its summary decides; no kubelet
    verdict applies (the pod outlives the run)."""
    result = log.result
    base: dict[str, Any] = {"started_at": started_at, "finished_at": now}
    if result is None:
        return Verdict(
            phase="Error",
            reason="NoResult",
            message="the runner's answer ended without a summary that verifies "
            f"({log.dropped_lines} lines did not verify)",
            retryable=True,
            **base,
        )
    base.update(_output_fields(log, result, settings))
    base.update(_reported_fields(result))
    out_of_memory = _out_of_memory(pod, result, base, settings)
    if out_of_memory is not None:
        return out_of_memory
    if result.cancelled:
        return cancelled_on_request(**base)
    return _runner_verdict(result, mode, base, settings.max_diagnostics)


def cancelled_on_request(**fields: Any) -> Verdict:
    """The platform stopped the run because it was asked to (the cancel annotation, or the
    gateway's DELETE)."""
    return Verdict(
        "Cancelled",
        "Cancelled",
        f"cancelled on request ({CANCEL_ANNOTATION})",
        retryable=False,
        **fields,
    )


def run_deadline(
    started_at: datetime, timeout_seconds: int, settings: OperatorSettings
) -> datetime:
    """When the operator stops a program that started at `started_at` (kubelet's time)."""
    return started_at + timedelta(seconds=timeout_seconds + settings.deadline_grace_seconds)


def timed_out_by_platform(timeout_seconds: int, base: dict[str, Any]) -> Verdict:
    """The operator's deadline passed without a result from the runner."""
    return Verdict(
        phase="TimedOut",
        reason="DeadlineExceeded",
        message=f"the program did not finish within its timeout of {timeout_seconds}s; "
        "the platform stopped the sandbox",
        retryable=False,
        **base,
    )


def past_deadline(started: datetime, timeout_seconds: int, now: datetime) -> Verdict:
    """The operator's own deadline passed while it waited for the runner's answer."""
    duration = int((now - started).total_seconds() * 1000)
    base = {"started_at": started, "finished_at": now, "duration_ms": duration}
    return timed_out_by_platform(timeout_seconds, base)


def runner_unavailable(started: datetime, now: datetime) -> Verdict:
    """The runner gave no whole answer: the run is over, without a result (never re-run)."""
    return Verdict(
        "Error",
        "RunnerUnavailable",
        "the sandbox's runner could not be reached or stopped answering before it reported "
        "a result; the program was not run again",
        retryable=True,
        started_at=started,
        finished_at=now,
    )


def _runner_verdict(
    result: RunnerResult, mode: str, base: dict[str, Any], max_diagnostics: int
) -> Verdict:
    """The runner's verified report of the program."""
    if result.error is not None:
        return Verdict(
            phase="Error",
            reason="RunnerError",
            message=f"the runner could not run the program: {result.error}",
            retryable=False,
            **base,
        )
    if result.compile is not None and not result.compile.succeeded:
        return _compile_failed(result.compile, base)
    if result.timed_out:
        return Verdict(
            phase="TimedOut",
            reason="DeadlineExceeded",
            message="the program ran longer than its timeout and was killed",
            retryable=False,
            **base,
        )
    if mode == "lint" and result.diagnostics is not None:
        count = len(result.diagnostics)
        return Verdict(
            phase="Succeeded",
            reason="Completed",
            message=f"the linter reported {count} finding{'s' if count != 1 else ''}",
            retryable=False,
            diagnostics=result.diagnostics[:max_diagnostics],
            **base,
        )
    if result.signal is not None:
        return Verdict(
            phase="Failed",
            reason="Signaled",
            message=f"the program was killed by {_signal_name(result.signal)}",
            retryable=False,
            **base,
        )
    if result.exit_code == 0:
        return Verdict(
            phase="Succeeded", reason="Completed", message="exit code 0", retryable=False, **base
        )
    return Verdict(
        phase="Failed",
        reason="NonZeroExit",
        message=f"the program exited with code {result.exit_code}",
        retryable=False,
        **base,
    )


def _compile_failed(compiled: CompileResult, base: dict[str, Any]) -> Verdict:
    """The build failed, so the program never ran (its output is the compiler's)."""
    phase: Phase = "Failed"
    reason = COMPILATION_ERROR
    if compiled.timed_out:
        phase, reason = "TimedOut", "DeadlineExceeded"
        message = "the program did not build within its compile time limit; the compiler was killed"
    elif compiled.exit_code is not None:
        message = f"the program did not build (compiler exit {compiled.exit_code})"
    else:
        killer = _signal_name(compiled.signal or SIGKILL)
        message = f"the program did not build (compiler killed by {killer})"
    return Verdict(phase=phase, reason=reason, message=message, retryable=False, **base)


def _no_result_message(terminated: dict[str, Any], log: LogSummary | None) -> str:
    """A fixed sentence with only what the kubelet and the operator counted: the termination
    message and the log are the program's to write when the runner did not report."""
    exit_code = terminated.get("exitCode")
    if exit_code == 0:
        dropped = f" ({log.dropped_lines} log lines did not verify)" if log else ""
        return (
            "the sandbox ended without a result: the runner's summary is missing or does "
            f"not match its log{dropped}"
        )
    if isinstance(exit_code, int) and exit_code > SIGNAL_EXIT_BASE:
        signal_name = _signal_name(exit_code - SIGNAL_EXIT_BASE)
        return (
            f"the sandbox ended without a result: its runner was killed by {signal_name} "
            f"(container exit code {exit_code})"
        )
    code = exit_code if isinstance(exit_code, int) else "unknown"
    return f"the sandbox ended without a result: its runner exited with code {code}"


def _ran_out_of_memory(pod: Pod, result: RunnerResult | None, settings: OperatorSettings) -> bool:
    if result is None or result.signal != SIGKILL or result.timed_out:
        return False
    limit = _program_memory_bytes(pod, settings)
    peak = result.peak_memory_bytes
    return limit is not None and peak is not None and peak >= OOM_NEAR_LIMIT * limit


def _program_memory_bytes(pod: Pod, settings: OperatorSettings) -> int | None:
    """The program's memory limit: the pod's, less the sandbox's overhead."""
    limit = _memory_limit_bytes(pod)
    if limit is None:
        return None
    return max(0, limit - int(parse_quantity(settings.sandbox_memory_overhead)))


def _memory_limit_text(pod: Pod, settings: OperatorSettings) -> str:
    limit = _program_memory_bytes(pod, settings)
    return "?" if limit is None else byte_quantity(limit)


def observe_pod(
    pod: Pod,
    *,
    log: LogSummary | None,
    mode: str,
    timeout_seconds: int,
    now: datetime,
    settings: OperatorSettings,
    nodes: NodeView = NodeView(),
) -> Verdict:
    """The verdict a pod supports right now. `log` is the verified pod log once it finished
    (None when there is no summary to verify it with, or it could not be read); `nodes`: what
    a pod that has not started is judged against besides itself."""
    if pod_finished(pod):
        return observe_finished(
            pod, log, mode=mode, timeout_seconds=timeout_seconds, now=now, settings=settings
        )
    running = (_container_status(pod).get("state") or {}).get("running")
    if isinstance(running, dict):
        started_at = parse_time(running.get("startedAt")) or now
        if now >= run_deadline(started_at, timeout_seconds, settings):
            # The runner did not end the program in time: frozen, or dead without a trace.
            duration = int((now - started_at).total_seconds() * 1000)
            base = {"started_at": started_at, "finished_at": now, "duration_ms": duration}
            return timed_out_by_platform(timeout_seconds, base)
        return Verdict(
            phase="Running",
            reason="Started",
            message="the program is running",
            started_at=started_at,
        )
    return observe_pending(pod, now, settings, nodes)


def clip_message(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 1] + "…"


def _rank(phase: str | None) -> int:
    if phase is None:
        return -1
    return _TERMINAL_RANK if is_terminal(phase) else _PHASE_RANK.get(phase, 0)


def supersedes(verdict: Verdict, previous: Status | None) -> bool:
    """Whether a verdict may replace the status: never backwards, never past a final one."""
    phase = (previous or {}).get("phase")
    if is_terminal(phase):
        return False
    return _rank(verdict.phase) >= _rank(phase)


def set_condition(
    conditions: dict[str, dict[str, Any]],
    kind: str,
    status: str,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
) -> None:
    previous = conditions.get(kind)
    transition = now
    if previous is not None and previous.get("status") == status:
        transition = previous.get("lastTransitionTime") or now
    condition: dict[str, Any] = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    conditions[kind] = condition


def _diagnostics(found: list[dict[str, Any]] | None) -> list[Diagnostic] | None:
    """The runner's findings that are findings; the sandbox can write anything there."""
    if found is None:
        return None
    diagnostics = []
    for item in found:
        try:
            diagnostics.append(Diagnostic.model_validate(item))
        except ValidationError:
            continue
    return diagnostics


def _conditions(
    previous: Status, verdict: Verdict, started: bool, refused: bool, stamp: str, gen: int | None
) -> list[Condition]:
    conditions = {c["type"]: c for c in previous.get("conditions") or [] if "type" in c}
    if refused:
        set_condition(conditions, "Accepted", "False", verdict.reason, verdict.message, stamp, gen)
    else:
        set_condition(conditions, "Accepted", "True", "PodCreated", "", stamp, gen)
    if started:
        set_condition(conditions, "Started", "True", "Started", "", stamp, gen)
    else:
        set_condition(conditions, "Started", "False", verdict.reason, "", stamp, gen)
    if verdict.terminal:
        set_condition(conditions, "Completed", "True", verdict.reason, verdict.message, stamp, gen)
        succeeded = "True" if verdict.phase == "Succeeded" else "False"
        set_condition(
            conditions, "Succeeded", succeeded, verdict.reason, verdict.message, stamp, gen
        )
    else:
        set_condition(conditions, "Completed", "False", verdict.phase, "", stamp, gen)
    if verdict.reason in (QUEUED, WAITING_FOR_SESSION):
        why = "Unschedulable" if verdict.reason == QUEUED else WAITING_FOR_SESSION
        set_condition(conditions, QUEUED, "True", why, verdict.message, stamp, gen)
    elif QUEUED in conditions:
        set_condition(conditions, QUEUED, "False", verdict.reason, "", stamp, gen)
    return [Condition.model_validate(conditions[k]) for k in sorted(conditions)]


def next_status(
    previous: Status | None,
    verdict: Verdict,
    *,
    generation: int | None,
    pod_name: str | None,
    now: datetime,
    egress_blocked: list[BlockedEgress] | None = None,
) -> Status:
    """The whole status after `verdict` (call `supersedes` first), built through the model;
    `egress_blocked`: what the egress proxy refused this execution."""
    previous = previous or {}
    verdict = replace(verdict, message=clip_message(verdict.message))
    started_at = verdict.started_at or parse_time(previous.get("startedAt"))
    pod_name = pod_name or previous.get("podName")
    refused = verdict.terminal and not pod_name
    status = CodeExecutionStatus(
        phase=verdict.phase,
        reason=verdict.reason,
        message=verdict.message or None,
        retryable=verdict.retryable,
        exit_code=verdict.exit_code,
        signal=verdict.signal,
        stdout=verdict.stdout,
        stderr=verdict.stderr,
        stdout_truncated=verdict.stdout_truncated,
        stderr_truncated=verdict.stderr_truncated,
        diagnostics=_diagnostics(verdict.diagnostics),
        compile_output=verdict.compile_output,
        compile_output_truncated=verdict.compile_output_truncated,
        outputs=None
        if verdict.outputs is None
        else [OutputFileStatus.model_validate(entry) for entry in verdict.outputs],
        outputs_config_map=verdict.outputs_config_map,
        outputs_truncated=verdict.outputs_truncated,
        started_at=started_at,
        finished_at=verdict.finished_at,
        duration_ms=verdict.duration_ms,
        peak_memory_bytes=verdict.peak_memory_bytes,
        pod_name=pod_name,
        start_mode=verdict.start_mode or previous.get("startMode"),
        wait_ms=verdict.wait_ms if verdict.wait_ms is not None else previous.get("waitMs"),
        session=verdict.session or previous.get("session"),
        result=verdict.result,
        state_lost=verdict.state_lost,
        reported_by=verdict.reported_by,
        conditions=_conditions(
            previous, verdict, started_at is not None, refused, format_time(now), generation
        ),
        observed_generation=generation,
        egress_blocked=egress_blocked or None,
    )
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def status_patch(previous: Status | None, new: Status) -> Status:
    """A JSON merge patch from `previous` to `new`: removed fields become null."""
    patch: Status = {key: value for key, value in new.items() if (previous or {}).get(key) != value}
    for key in previous or {}:
        if key not in new:
            patch[key] = None
    return patch

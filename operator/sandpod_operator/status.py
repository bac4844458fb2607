"""Pure status derivation: what a sandbox pod (and the runner's report) says -> CR status.

`observe_pod` turns a pod (a plain dict as the API returns it) into a Verdict, and
`next_status` folds a Verdict into the previous status, keeping conditions' transition
times and never moving backwards (a terminal status is final).
"""

import signal as signals
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sandpod_contract.models import (
    CodeExecutionStatus,
    Condition,
    Diagnostic,
    Phase,
    format_time,
    is_terminal,
)
from sandpod_contract.quantities import parse_quantity
from sandpod_contract.runner import LogSummary, RunnerResult, parse_termination_message

from sandpod_operator.settings import OperatorSettings

Pod = dict[str, Any]
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
TIMEOUT_EXIT_CODE = 124
SIGKILL = 9
# A process killed by signal N exits (as seen by its parent, here the kubelet) with 128 + N.
SIGNAL_EXIT_BASE = 128
# A run killed by SIGKILL that had come this close to its memory limit ran out of memory.
OOM_NEAR_LIMIT = 0.9

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
    stdout: str | None = None
    stderr: str | None = None
    stdout_truncated: bool | None = None
    stderr_truncated: bool | None = None
    diagnostics: list[dict[str, Any]] | None = field(default=None)

    @property
    def terminal(self) -> bool:
        return is_terminal(self.phase)


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


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


def observe_pending(pod: Pod, now: datetime, settings: OperatorSettings) -> Verdict:
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
        since = parse_time(scheduled.get("lastTransitionTime")) or now
        message = str(scheduled.get("message") or "no node can run the sandbox")
        if (now - since).total_seconds() >= settings.unschedulable_grace_seconds:
            return Verdict(
                phase="Error",
                reason="Unschedulable",
                message=message,
                retryable=True,
                finished_at=now,
            )
        return Verdict(phase="Pending", reason="Unschedulable", message=message)
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp")) or now
    if (now - created).total_seconds() >= settings.pod_startup_timeout_seconds:
        detail = f" (last: {waiting_reason}: {waiting_message})" if waiting_reason else ""
        return Verdict(
            phase="Error",
            reason="StartupTimeout",
            message=f"the sandbox did not start within {settings.pod_startup_timeout_seconds}s"
            + detail,
            retryable=True,
            finished_at=now,
        )
    if waiting_reason:
        return Verdict(phase="Pending", reason=waiting_reason, message=waiting_message)
    if scheduled.get("status") == "True":
        return Verdict(phase="Pending", reason="Scheduled", message="starting the sandbox")
    return Verdict(phase="Pending", reason="PodCreated", message="waiting for a node")


def _output_fields(log: LogSummary | None, result: RunnerResult | None) -> dict[str, Any]:
    if log is None:
        return {
            "stdout_truncated": result.stdout_truncated if result else None,
            "stderr_truncated": result.stderr_truncated if result else None,
        }
    return {
        "stdout": log.stdout,
        "stderr": log.stderr,
        "stdout_truncated": log.stdout_clipped or bool(result and result.stdout_truncated),
        "stderr_truncated": log.stderr_clipped or bool(result and result.stderr_truncated),
    }


def observe_finished(
    pod: Pod, log: LogSummary | None, mode: str, now: datetime, max_diagnostics: int
) -> Verdict:
    """A pod that ended: the runner's report decides, the kubelet's verdicts take precedence."""
    pod_status = pod.get("status") or {}
    terminated = terminated_state(pod) or {}
    started_at = parse_time(terminated.get("startedAt"))
    finished_at = parse_time(terminated.get("finishedAt")) or now
    result = (log.result if log else None) or parse_termination_message(terminated.get("message"))
    base: dict[str, Any] = {
        "started_at": started_at,
        "finished_at": finished_at,
        **_output_fields(log, result),
    }
    if result is not None:
        base["exit_code"] = result.exit_code
        base["signal"] = result.signal
        base["duration_ms"] = result.duration_ms
    elif started_at is not None:
        base["exit_code"] = terminated.get("exitCode")
        base["duration_ms"] = int((finished_at - started_at).total_seconds() * 1000)

    pod_reason = str(pod_status.get("reason") or "")
    pod_message = str(pod_status.get("message") or "")
    if pod_reason == "DeadlineExceeded":
        if started_at is None and result is None:
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
    if pod_reason == "Evicted":
        if "ephemeral" in pod_message.lower() or "emptydir" in pod_message.lower():
            return Verdict(
                phase="Failed",
                reason="StorageLimitExceeded",
                message=pod_message,
                retryable=False,
                **base,
            )
        return Verdict(phase="Error", reason="Evicted", message=pod_message, retryable=True, **base)
    if terminated.get("reason") == "OOMKilled" or _ran_out_of_memory(pod, result):
        return Verdict(
            phase="Failed",
            reason="OOMKilled",
            message=f"the program exceeded its memory limit of "
            f"{_memory_limit_text(pod)} and was killed",
            retryable=False,
            # Killed, not exited: whatever exit code the container got is not the program's.
            **{**base, "exit_code": None, "signal": base.get("signal") or SIGKILL},
        )
    if terminated.get("reason") in START_ERRORS and result is None:
        return Verdict(
            phase="Error",
            reason="ContainerStartFailed",
            message=str(terminated.get("message") or terminated.get("reason")),
            retryable=False,
            **base,
        )
    if result is None:
        return Verdict(
            phase="Error",
            reason="NoResult",
            message=_no_result_message(terminated),
            retryable=True,
            **base,
        )
    if result.error is not None:
        return Verdict(
            phase="Error", reason="RunnerError", message=result.error, retryable=False, **base
        )
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


def _no_result_message(terminated: dict[str, Any]) -> str:
    exit_code = terminated.get("exitCode")
    detail = f"exit code {exit_code}, {terminated.get('reason') or 'no reason'}"
    if isinstance(exit_code, int) and exit_code > SIGNAL_EXIT_BASE:
        # The runner reports before it exits; a signal took it first. The program runs as the
        # same user as the runner, so it may have sent it (kill -9 1).
        signal_name = _signal_name(exit_code - SIGNAL_EXIT_BASE)
        return (
            f"the sandbox ended without a result: its runner was killed by {signal_name} "
            f"({detail}), possibly by the program itself"
        )
    return f"the sandbox ended without a result ({detail})"


def _ran_out_of_memory(pod: Pod, result: RunnerResult | None) -> bool:
    if result is None or result.signal != SIGKILL or result.timed_out:
        return False
    limit = _memory_limit_bytes(pod)
    peak = result.peak_memory_bytes
    return limit is not None and peak is not None and peak >= OOM_NEAR_LIMIT * limit


def _memory_limit_text(pod: Pod) -> str:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    limits = (containers[0].get("resources") or {}).get("limits") or {}
    return str(limits.get("memory", "?"))


def observe_pod(
    pod: Pod,
    *,
    log: LogSummary | None,
    mode: str,
    now: datetime,
    settings: OperatorSettings,
) -> Verdict:
    """The verdict a pod supports right now. `log` is the parsed pod log once it finished."""
    if pod_finished(pod):
        return observe_finished(pod, log, mode, now, settings.max_diagnostics)
    running = (_container_status(pod).get("state") or {}).get("running")
    if isinstance(running, dict):
        return Verdict(
            phase="Running",
            reason="Started",
            message="the program is running",
            started_at=parse_time(running.get("startedAt")) or now,
        )
    return observe_pending(pod, now, settings)


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
    return [Condition.model_validate(conditions[k]) for k in sorted(conditions)]


def next_status(
    previous: Status | None,
    verdict: Verdict,
    *,
    generation: int | None,
    pod_name: str | None,
    now: datetime,
) -> Status:
    """The whole status after `verdict` (call `supersedes` first), built through the model."""
    previous = previous or {}
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
        started_at=started_at,
        finished_at=verdict.finished_at,
        duration_ms=verdict.duration_ms,
        pod_name=pod_name,
        conditions=_conditions(
            previous, verdict, started_at is not None, refused, format_time(now), generation
        ),
        observed_generation=generation,
    )
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def status_patch(previous: Status | None, new: Status) -> Status:
    """A JSON merge patch from `previous` to `new`: removed fields become null."""
    patch: Status = {key: value for key, value in new.items() if (previous or {}).get(key) != value}
    for key in previous or {}:
        if key not in new:
            patch[key] = None
    return patch

"""The serving core: one execution run (or re-attached to) on a serving runner, its answer
turned into a verdict. Pools (the record path and the direct path) and sessions all run
through `serve_once`; what they record, and where, is theirs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sandpod_contract.catalog import Catalog
from sandpod_contract.models import CodeExecutionSpec
from sandpod_contract.runner import LogSummary

from sandpod_operator.executions.builders import InvalidSpecError, Plan, plan_execution
from sandpod_operator.kube import Manifest
from sandpod_operator.pools.warm import WarmPath, run_request
from sandpod_operator.serving.runner import RunnerRefused, RunnerRetired, RunnerUnavailable
from sandpod_operator.settings import OperatorSettings
from sandpod_operator.status import (
    Verdict,
    clip_message,
    observe_served,
    past_deadline,
    run_deadline,
    runner_unavailable,
)


class NotServing(Exception):
    """No live sandbox can take a direct run now (the session is starting, has ended or lost
    its sandbox; no pool pod fits or is free): the record path takes it."""


class InvalidRun(Exception):
    """The run does not fit its sandbox (language, limits, an invalid spec)."""


def planned(
    execution: Manifest, catalog: Catalog, settings: OperatorSettings
) -> tuple[CodeExecutionSpec, Plan]:
    """The execution's spec and plan; InvalidRun saying what is wrong."""
    try:
        spec = CodeExecutionSpec.model_validate(execution.get("spec") or {})
        return spec, plan_execution(spec, catalog, settings)
    except (ValidationError, InvalidSpecError) as error:
        raise InvalidRun(clip_message(str(error))) from error


@dataclass(frozen=True)
class Answer:
    """The verdict of one served run, and the runner's verified log it came from (None when
    the runner did not answer: the run timed out or the runner was unreachable); `refused`:
    the runner did not start it (another sandbox may); `retired`: nor will it start another."""

    verdict: Verdict
    log: LogSummary | None
    refused: bool = False
    retired: bool = False

    @property
    def serves_on(self) -> bool:
        """Whether the sandbox takes further runs: its runner said so in a verified answer,
        or refused this one only because it ran another."""
        if self.refused:
            return not self.retired
        result = self.log.result if self.log is not None else None
        return result is not None and not result.retiring


async def serve_once(
    warm: WarmPath,
    pod: Manifest,
    run_id: str,
    spec: CodeExecutionSpec,
    plan: Plan,
    started: datetime,
    settings: OperatorSettings,
    proxy_variables: dict[str, str] | None = None,
) -> Answer:
    """Run (or re-attach to: same `run_id`) the execution on the pod's runner: the runner's
    verified verdict, or the platform's when it gave none before the run's deadline."""
    deadline = run_deadline(started, plan.run_seconds, settings)
    request: dict[str, Any] = run_request(run_id, spec, plan, settings, proxy_variables)
    try:
        log = await warm.run(pod, request, seconds_left=(deadline - _now()).total_seconds())
    except TimeoutError:
        return Answer(past_deadline(started, plan.run_seconds, _now()), None)
    except RunnerRefused as refusal:
        retired = isinstance(refusal, RunnerRetired)
        return Answer(runner_unavailable(started, _now()), None, refused=True, retired=retired)
    except RunnerUnavailable:
        return Answer(runner_unavailable(started, _now()), None)
    verdict = observe_served(
        pod, log, mode=spec.mode, started_at=started, now=_now(), settings=settings
    )
    return Answer(verdict, log)


def _now() -> datetime:
    return datetime.now(UTC)

"""What the REST routes of every family share: their common errors, paging, the
Idempotency-Key header, and how a create answers (?wait=, 200 or 202, Location)."""

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Query, Response

from sandpod_gateway.schemas import TERMINAL_STATUSES, ExecutionResult
from sandpod_gateway.usecases.executions import CreateOutcome, PageQuery
from sandpod_gateway.web.dependencies import MetricsDep
from sandpod_gateway.web.metrics import GatewayMetrics

# Every route of the REST families authenticates (401), validates (422), counts against the
# tenant's request rate (429) and talks to the cluster (503).
COMMON_ERRORS = (401, 422, 429, 503)
# Where a created execution is found (the Location of every create, in a session or not).
EXECUTIONS_PATH = "/v1/executions"


async def page_query(
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(min_length=1, max_length=4096)] = None,
) -> PageQuery:
    return PageQuery(limit, cursor)


PageParams = Annotated[PageQuery, Depends(page_query)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="Retrying a create with the same key returns the same execution",
    ),
]


@dataclass(frozen=True)
class CreateCall:
    """A create request's Idempotency-Key and ?wait=, and where its answer goes."""

    idempotency_key: str | None
    wait: bool
    response: Response
    metrics: GatewayMetrics

    def answer(self, outcome: CreateOutcome) -> ExecutionResult:
        """200 once finished, else 202; Location; counted when this request created it."""
        result = outcome.result
        if outcome.created:
            self.metrics.executions.labels(result.language, result.status.value).inc()
        self.response.status_code = 200 if result.status in TERMINAL_STATUSES else 202
        self.response.headers["Location"] = f"{EXECUTIONS_PATH}/{result.id}"
        return result


async def create_call(
    response: Response,
    metrics: MetricsDep,
    idempotency_key: IdempotencyKey = None,
    wait: Annotated[bool, Query(description="Wait for the result")] = True,
) -> CreateCall:
    return CreateCall(idempotency_key, wait, response, metrics)


CreateCallDep = Annotated[CreateCall, Depends(create_call)]

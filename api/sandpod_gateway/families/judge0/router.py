"""Judge0 CE 1.13.1's API at /judge0, over the execution use cases (translation: judge0.py).

Its official client works unchanged with JUDGE0_CE_ENDPOINT=<gateway>/judge0 and
JUDGE0_CE_AUTH_HEADERS={"X-Auth-Token": "<API key>"} (Judge0's own header; a bearer key works
too). Errors are Judge0's: {"error": "..."}, and 422 with the submission's errors per field.
"""

import asyncio
import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from sandpod_gateway.families.judge0 import judge0
from sandpod_gateway.families.judge0.callbacks import Judge0Callbacks
from sandpod_gateway.kube.resources import Resource
from sandpod_gateway.kube.service import ExecutionNotFound
from sandpod_gateway.policy.admission import check_concurrency
from sandpod_gateway.policy.auth import Tenant
from sandpod_gateway.usecases.executions import (
    ExecutionContext,
    Queueing,
    create_execution,
    get_owned_execution,
)
from sandpod_gateway.web.dependencies import (
    AdmissionDep,
    CatalogDep,
    KeyStoreDep,
    MetricsDep,
    SettingsDep,
    StateDependency,
    authenticate,
    execution_context_of,
    from_app_state,
)
from sandpod_gateway.web.errors import GatewayError, as_gateway_error
from sandpod_gateway.web.family_route import FamilyRoute
from sandpod_gateway.web.metrics import GatewayMetrics

PREFIX = "/judge0"
AUTH_HEADER = "X-Auth-Token"
# Judge0's authorization (the X-Auth-User header) guards calls sandpod does not serve, so it is
# off, as in a Judge0 without AUTHZ_TOKEN: POST /authorize is 403 for every tenant.
AUTHORIZATION_OFF = (
    "authorization is disabled: sandpod serves none of the calls X-Auth-User authorizes "
    "(listing every submission, deleting one)"
)
# A batch's submissions created at once, at most; and read at once.
BATCH_CREATES = 16
BATCH_READS = 16

get_judge0_callbacks: StateDependency[Judge0Callbacks] = from_app_state("judge0_callbacks")
Judge0CallbacksDep = Annotated[Judge0Callbacks, Depends(get_judge0_callbacks)]


def judge0_status(error: GatewayError) -> tuple[int, str]:
    """A gateway error's status and message as Judge0's. Submissions beyond the tenant's
    concurrency wait in its queue, so the limit of both answers as a full queue does."""
    if error.code == "concurrency_limit":
        return 503, f"queue is full ({error.message})"
    return error.status_code, error.message


def judge0_error(error: GatewayError) -> JSONResponse:
    """{"error": message}, with the error's headers (Retry-After)."""
    status, message = judge0_status(error)
    return JSONResponse({"error": message}, status_code=status, headers=error.headers or None)


class Judge0Route(FamilyRoute):
    """A route whose errors (its dependencies' included) take Judge0's shapes."""

    def family_error(self, exc: Exception) -> Response | None:
        if isinstance(exc, judge0.InvalidSubmission):
            return JSONResponse(exc.errors, status_code=422)
        if isinstance(exc, judge0.InvalidFields):
            return JSONResponse({"error": str(exc)}, status_code=400)
        if isinstance(exc, RequestValidationError):
            errors: judge0.Errors = {}
            for error in exc.errors():
                field = str(error["loc"][-1]) if error.get("loc") else "base"
                errors.setdefault(field, []).append(str(error.get("msg", "is invalid")))
            return JSONResponse(errors, status_code=422)
        return None

    def gateway_error(self, error: GatewayError) -> Response:
        return judge0_error(error)


router = APIRouter(prefix=PREFIX, tags=["judge0"], route_class=Judge0Route, include_in_schema=False)


async def judge0_tenant(
    request: Request, key_store: KeyStoreDep, settings: SettingsDep, admission: AdmissionDep
) -> Tenant:
    """The caller's tenant, by X-Auth-Token (Judge0's header) or a bearer key."""
    key = request.headers.get(AUTH_HEADER)
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if key is None and scheme.lower() == "bearer" and credentials.strip():
        key = credentials.strip()
    return await authenticate(key, key_store, settings, admission, f"{AUTH_HEADER}: <key>")


Judge0Tenant = Annotated[Tenant, Depends(judge0_tenant)]
ExecutionContextDep = Annotated[ExecutionContext, Depends(execution_context_of(judge0_tenant))]
# Judge0 reads its flags as the exact text "true".
Flag = Annotated[str | None, Query()]
Fields = Annotated[str | None, Query(max_length=2048)]


@router.post("/authenticate")
async def authenticate_key(_tenant: Judge0Tenant) -> Response:
    """200 with no body for a known key (401 otherwise, from judge0_tenant)."""
    return Response()


@router.post("/authorize")
async def authorize(_tenant: Judge0Tenant) -> Response:
    raise GatewayError(403, "forbidden", AUTHORIZATION_OFF)


@router.get("/about")
async def about(_tenant: Judge0Tenant) -> dict[str, str]:
    return judge0.about()


@router.get("/version")
async def version(_tenant: Judge0Tenant) -> PlainTextResponse:
    return PlainTextResponse(judge0.JUDGE0_VERSION)


@router.get("/config_info")
async def config_info(tenant: Judge0Tenant, settings: SettingsDep) -> judge0.Judge0Config:
    return judge0.config_for(tenant, settings)


@router.get("/statuses")
async def statuses(_tenant: Judge0Tenant) -> list[dict[str, Any]]:
    return judge0.statuses()


@router.get("/languages")
async def languages(_tenant: Judge0Tenant, catalog: CatalogDep) -> list[dict[str, Any]]:
    return judge0.languages(catalog)


# Before /languages/{language_id}, which would take "all" for an id.
@router.get("/languages/all")
async def all_languages(_tenant: Judge0Tenant, catalog: CatalogDep) -> list[dict[str, Any]]:
    return judge0.all_languages(catalog)


@router.get("/languages/{language_id}")
async def language(language_id: int, _tenant: Judge0Tenant, catalog: CatalogDep) -> dict[str, Any]:
    found = judge0.language(catalog, language_id)
    if found is None:
        raise GatewayError(404, "not_found", f"Couldn't find Language with 'id'={language_id}")
    return found


@dataclass(frozen=True)
class Submitting:
    """What creating a submission takes besides the execution use cases."""

    metrics: GatewayMetrics
    callbacks: Judge0Callbacks


async def submitting(metrics: MetricsDep, callbacks: Judge0CallbacksDep) -> Submitting:
    return Submitting(metrics, callbacks)


SubmittingDep = Annotated[Submitting, Depends(submitting)]


async def _submit(
    data: object,
    ctx: ExecutionContext,
    how: Submitting,
    *,
    base64_encoded: bool,
    wait: bool,
    queueing: Queueing,
) -> Resource:
    """Create the execution a submission stands for (waiting for it if asked), and its
    callback once it is done."""
    translated = judge0.translate(
        judge0.parse_submission(data),
        base64_encoded=base64_encoded,
        config=judge0.config_for(ctx.tenant, ctx.settings),
        catalog=ctx.catalog,
        max_code_bytes=ctx.settings.max_code_bytes,
        callback_hosts=ctx.settings.judge0_callback_hosts,
    )
    outcome = await create_execution(
        translated.request,
        ctx,
        idempotency_key=None,
        wait=wait,
        name=str(uuid.uuid4()),
        annotations=translated.annotations(),
        queueing=queueing,
    )
    if outcome.created:
        how.metrics.executions.labels(outcome.result.language, outcome.result.status.value).inc()
        names = judge0.language_names(ctx.catalog)
        how.callbacks.schedule(outcome.resource, ctx.executions, ctx.settings, names)
    return outcome.resource


@router.post("/submissions", status_code=201)
async def create_submission(
    ctx: ExecutionContextDep,
    how: SubmittingDep,
    body: Annotated[Any, Body()] = None,
    base64_encoded: Flag = None,
    wait: Flag = None,
    fields: Fields = None,
) -> dict[str, Any]:
    requested = judge0.requested_fields(fields)
    encoded = base64_encoded == "true"
    queueing = Queueing(ctx.settings.judge0_queue_size)
    resource = await _submit(
        body, ctx, how, base64_encoded=encoded, wait=wait == "true", queueing=queueing
    )
    if wait != "true":
        return {"token": resource["metadata"]["name"]}
    return judge0.submission_view(resource, requested, encoded, judge0.language_names(ctx.catalog))


def _batch_size_problem(count: int, limit: int) -> str | None:
    if count == 0:
        return "there should be at least one submission in a batch"
    if count > limit:
        return f"number of submissions in a batch should be less than or equal to {limit}"
    return None


@router.post("/submissions/batch", status_code=201)
async def create_submission_batch(
    ctx: ExecutionContextDep,
    how: SubmittingDep,
    response: Response,
    body: Annotated[Any, Body()] = None,
    base64_encoded: Flag = None,
) -> list[dict[str, Any]]:
    items = body.get("submissions") if isinstance(body, dict) else None
    items = items if isinstance(items, list) else []
    problem = _batch_size_problem(len(items), ctx.settings.judge0_max_batch_size)
    if problem is not None:
        raise GatewayError(400, "bad_request", problem)
    # As Judge0 checks its queue: the whole batch fits, or none of it is created.
    await check_concurrency(
        ctx.executions,
        ctx.tenant,
        ctx.settings,
        wanted=len(items),
        queue_size=ctx.settings.judge0_queue_size,
    )
    # Each created queued at once, concurrently (Judge0's client waits 5 s for the answer):
    # the operator's queue starts them in turn.
    queueing = Queueing(ctx.settings.judge0_queue_size, admitted=True)
    creating = asyncio.Semaphore(BATCH_CREATES)

    async def answer(item: object) -> dict[str, Any]:
        async with creating:
            try:
                resource = await _submit(
                    item,
                    ctx,
                    how,
                    base64_encoded=base64_encoded == "true",
                    wait=False,
                    queueing=queueing,
                )
            except judge0.InvalidSubmission as exc:
                return dict(exc.errors)
            except Exception as exc:
                error = as_gateway_error(exc, ctx.settings.default_retry_after_seconds)
                if error is None:
                    raise
                return {"error": judge0_status(error)[1]}
        return {"token": resource["metadata"]["name"]}

    answers = await asyncio.gather(*(answer(item) for item in items))
    if not any("token" in answer for answer in answers):
        response.status_code = 422
    return answers


@router.get("/submissions/batch")
async def get_submission_batch(
    request: Request,
    ctx: ExecutionContextDep,
    tokens: Annotated[str | None, Query(max_length=65536)] = None,
    base64_encoded: Flag = None,
    fields: Fields = None,
) -> dict[str, list[dict[str, Any] | None]]:
    requested = judge0.requested_fields(fields)
    text = request.headers.get("tokens") or tokens or ""
    names = [token.strip() for token in text.strip().split(",") if token.strip()]
    problem = _batch_size_problem(len(names), ctx.settings.judge0_max_batch_size)
    if problem is not None:
        raise GatewayError(400, "bad_request", problem)
    # A read each (a list would carry every record the tenant keeps), BATCH_READS at a time.
    reading = asyncio.Semaphore(BATCH_READS)

    async def read(name: str) -> Resource | None:
        async with reading:
            return await _owned_or_none(name, ctx)

    found = await asyncio.gather(*(read(name) for name in names))
    languages = judge0.language_names(ctx.catalog)
    encoded = base64_encoded == "true"
    return {
        "submissions": [
            None
            if resource is None
            else judge0.submission_view(resource, requested, encoded, languages)
            for resource in found
        ]
    }


async def _owned_or_none(name: str, ctx: ExecutionContext) -> Resource | None:
    try:
        return await get_owned_execution(name, ctx.tenant, ctx.executions)
    except ExecutionNotFound:
        return None


@router.get("/submissions/{token}")
async def get_submission(
    token: str,
    ctx: ExecutionContextDep,
    base64_encoded: Flag = None,
    fields: Fields = None,
) -> dict[str, Any]:
    requested = judge0.requested_fields(fields)
    resource = await get_owned_execution(token, ctx.tenant, ctx.executions)
    return judge0.submission_view(
        resource, requested, base64_encoded == "true", judge0.language_names(ctx.catalog)
    )

"""HTTP routes of the job resource (docs/openapi.json)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, cast

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy.orm import Session

from curvplan.types.jobs import (
    CLIENT_JOB_CREATE_ADAPTER,
    INTERNAL_JOB_KINDS,
    JOB_KINDS,
    TERMINAL_STATUSES,
    JobCreateModel,
    JobOut,
    JobPage,
    PlanJobCreate,
)
from curvplan.types.planner import Recommendation
from curvplan_core.config import Settings
from curvplan_server.auth.dependencies import ProjectDep, authenticate
from curvplan_server.db import SessionDep
from curvplan_server.jobs import service
from curvplan_server.jobs.examples import CREATE_EXAMPLES, JOB_EXAMPLE, RECOMMENDATION_EXAMPLE
from curvplan_server.jobs.filters import (
    KIND_FILTER_SCHEMA,
    NAME_FILTER_SCHEMA,
    STATUS_FILTER_SCHEMA,
    TAG_FILTER_SCHEMA,
)
from curvplan_server.jobs.limits import PlanLimits, check_plan_work
from curvplan_server.jobs.submission import (
    SubmissionContext,
    internal_kind_message,
    plan_fan_out,
    prepare_job_body,
)
from curvplan_server.problems import (
    Problem,
    field_errors_from_pydantic,
    problem_responses,
    validation_problem,
)
from curvplan_server.ratelimit.policies import count_submission
from curvplan_server.webhooks.service import check_job_webhook

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MAX_IDEMPOTENCY_KEY_LENGTH = 255
_JSON_MEDIA = ("application/json", "application/problem+json")


def _check_content_type(request: Request) -> None:
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media and not (media in _JSON_MEDIA or media.endswith("+json")):
        raise Problem(
            415,
            f"send the job as JSON (Content-Type: application/json), not {media!r}",
            title="Unsupported Media Type",
        )


def _validate_body(raw: bytes) -> JobCreateModel:
    """The body as its kind's create model (validated once, from the raw bytes)."""
    if not raw.strip():
        raise validation_problem(
            [
                {
                    "field": "body",
                    "loc": ["body"],
                    "message": "a JSON body is required",
                    "type": "missing",
                }
            ]
        )
    try:
        model = CLIENT_JOB_CREATE_ADAPTER.validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise Problem(
                400,
                f"the request body is not valid JSON: {errors[0]['msg']}",
                title="Malformed JSON",
            ) from None
        if any(e["type"] == "model_type" and not e["loc"] for e in errors):
            raise validation_problem(
                [
                    {
                        "field": "body",
                        "loc": ["body"],
                        "message": "the body must be a JSON object",
                        "type": "model_type",
                    }
                ]
            ) from None
        for e in errors:  # the discriminated union puts the kind first in loc: drop it
            if e["type"] in ("union_tag_not_found", "union_tag_invalid"):
                e["loc"] = ("kind",)
                tag = (e.get("ctx") or {}).get("tag")
                if tag in INTERNAL_JOB_KINDS:  # a fan-out's child kind, not a client's
                    e["type"], e["msg"] = "internal_kind", internal_kind_message(tag)
            elif e["loc"] and e["loc"][0] in JOB_KINDS:
                e["loc"] = e["loc"][1:]
        raise validation_problem(field_errors_from_pydantic(errors, prefix=("body",))) from None
    # JSON can only carry U+0000 escaped, so the walk runs only when the escape is there.
    nul_locs = (
        list(_nul_locations(service.stored_request(model), ("body",))) if b"\\u0000" in raw else []
    )
    if nul_locs:
        raise validation_problem(
            [
                {
                    "field": ".".join(str(p) for p in loc),
                    "loc": list(loc),
                    "message": "must not contain the NUL character (\\u0000)",
                    "type": "string_nul",
                }
                for loc in nul_locs
            ]
        )
    return cast(JobCreateModel, model)


def _nul_locations(value: Any, loc: tuple[str | int, ...]) -> Iterator[tuple[str | int, ...]]:
    """Where a validated body holds a NUL character (a key or a string value).

    PostgreSQL's text and jsonb cannot store U+0000: without this check such a body
    passes validation and then fails in the database with a 500.
    """
    if isinstance(value, str):
        if "\x00" in value:
            yield loc
    elif isinstance(value, dict):
        for key, item in value.items():
            shown = key.replace("\x00", "\\u0000")
            if shown != key:
                yield (*loc, shown)
            yield from _nul_locations(item, (*loc, shown))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _nul_locations(item, (*loc, index))


def _job_response(job: JobOut | JobPage, status_code: int, **headers: str) -> Response:
    """The job (or page) as JSON, serialized from its response model."""
    return Response(
        service.job_json(job),
        status_code=status_code,
        headers=headers or None,
        media_type="application/json",
    )


IDEMPOTENCY_KEY_PARAMETER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": MAX_IDEMPOTENCY_KEY_LENGTH},
    "description": "Retry-safe submission (draft-ietf-httpapi-idempotency-key-header): the "
    "same key and body replay the first answer (header Idempotent-Replayed: true); the same "
    "key with another body is a 422. Keys are scoped to the project.",
}


@router.post(
    "",
    name="create_job",
    status_code=202,
    response_model=JobOut,
    summary="Submit a job",
    responses={
        202: {
            "description": "Queued (or replayed: header Idempotent-Replayed: true); "
            "the job's URL is in Location",
            "content": {"application/json": {"example": JOB_EXAMPLE}},
        },
        **problem_responses(
            400,
            401,
            404,
            409,
            413,
            415,
            422,
            500,
            _429="Too many submissions from this key or project: wait Retry-After seconds",
        ),
    },
    openapi_extra={
        "parameters": [IDEMPOTENCY_KEY_PARAMETER],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/JobCreate"},
                    "examples": CREATE_EXAMPLES,
                }
            },
        },
    },
)
async def create_job(request: Request, session: SessionDep) -> Response:
    """Queue a job. Answers 202 with the job and its ``Location``.

    This is the hot path: the body is validated once from raw bytes, the key
    check usually hits the per-process cache, and the insert and commit run in
    one worker-thread hop.
    """
    auth = await authenticate(request, session)
    limits = await count_submission(request, auth)
    _check_content_type(request)
    idempotency_key = request.headers.get("idempotency-key")
    if idempotency_key is not None and not (
        0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_LENGTH and "\x00" not in idempotency_key
    ):
        raise validation_problem(
            [
                {
                    "field": "header.Idempotency-Key",
                    "loc": ["header", "Idempotency-Key"],
                    "message": f"must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} characters, no NUL",
                    "type": "string_length",
                }
            ]
        )
    body = _validate_body(await request.body())
    settings = request.app.state.settings
    check_plan_work(body, PlanLimits.from_settings(settings))
    if body.webhook_url is not None:
        await run_in_threadpool(
            check_job_webhook, session, settings, auth.project_id, str(body.webhook_url)
        )
    created = await run_in_threadpool(
        _create_and_commit,
        session,
        auth.project_id,
        body,
        settings.max_attempts,
        idempotency_key,
        settings.data_dir,
        settings.max_model_parameters,
        settings.max_job_devices,
        PlanLimits.from_settings(settings),
        settings,
    )
    headers = {"Location": created.job.links.self, **(limits.headers() if limits else {})}
    if created.replayed:
        headers["Idempotent-Replayed"] = "true"
    return _job_response(created.job, 202, **headers)


def _create_and_commit(
    session: Session,
    project_id: uuid.UUID,
    body: JobCreateModel,
    default_max_attempts: int,
    idempotency_key: str | None,
    data_dir: Path,
    max_model_parameters: int | None,
    max_job_devices: int,
    plan_limits: PlanLimits,
    settings: Settings | None = None,
) -> service.Created:
    # every kind's artifact ids, then the kind's own checks (model size, shards, from_job)
    context = SubmissionContext(
        session, project_id, data_dir, max_model_parameters, max_job_devices, settings
    )
    body = prepare_job_body(context, body)
    if isinstance(body, PlanJobCreate) and body.from_job is not None:  # the analysis's measurements
        check_plan_work(body, plan_limits)
    fan_out = plan_fan_out(context, body)  # admission by cost; the children, if it fans out
    created = service.create_job(
        session,
        project_id,
        body,
        default_max_attempts=default_max_attempts,
        idempotency_key=idempotency_key,
    )
    if fan_out is not None and not created.replayed:
        created = service.fan_out_at_submission(session, project_id, created, fan_out)
    session.commit()  # here, so the dependency has nothing left to do (no second hop)
    return created


@router.get(
    "",
    name="list_jobs",
    response_model=JobPage,
    summary="List jobs (newest first, cursor pagination)",
    responses=problem_responses(401, 422, 500),
)
def list_jobs(
    request: Request,
    session: SessionDep,
    auth: ProjectDep,
    status: Annotated[
        list[str] | None,
        Query(
            description="Repeat or comma-separate: status=queued,running",
            json_schema_extra=STATUS_FILTER_SCHEMA,
        ),
    ] = None,
    kind: Annotated[str | None, Query(json_schema_extra=KIND_FILTER_SCHEMA)] = None,
    name: Annotated[str | None, Query(json_schema_extra=NAME_FILTER_SCHEMA)] = None,
    tag: Annotated[
        list[str] | None,
        Query(description="key:value; repeatable (AND)", json_schema_extra=TAG_FILTER_SCHEMA),
    ] = None,
    page_size: Annotated[int | None, Query(ge=1)] = None,
    page_token: Annotated[str | None, Query()] = None,
) -> Response:
    """Jobs of the caller's project matching every filter given."""
    settings = request.app.state.settings
    size = min(page_size or settings.default_page_size, settings.max_page_size)
    filters = service.parse_filters(status, kind, name, tag)
    page = service.list_jobs(
        session, auth.project_id, filters, page_size=size, page_token=page_token
    )
    return _job_response(page, 200)


@router.get(
    "/{job_id}",
    name="get_job",
    response_model=JobOut,
    summary="Get a job; ?wait=N long-polls",
    responses={
        200: {
            "description": "The job; `result` is set once it succeeded",
            "content": {"application/json": {"example": JOB_EXAMPLE}},
        },
        **problem_responses(401, 404, 422, 500),
    },
)
async def get_job(
    request: Request,
    job_id: uuid.UUID,
    session: SessionDep,
    auth: ProjectDep,
    wait: Annotated[
        float,
        Query(
            ge=0,
            description="Seconds to wait for the status to change or become terminal "
            "(capped by the server, default 0: answer at once).",
        ),
    ] = 0,
) -> Response:
    """The job. With ``wait`` the answer comes when its status changes or ends, or at timeout."""
    settings = request.app.state.settings
    wait = min(wait, settings.long_poll_max_seconds)
    notifier = getattr(request.app.state, "job_notifier", None) if wait > 0 else None
    # Subscribed before the first read: a change right after it still wakes this request.
    subscription = notifier.subscribe(str(job_id)) if notifier is not None else None
    try:
        # Read and hand the connection back in one thread hop: a connection held while this
        # request waits for a thread could deadlock the pool under hundreds of long-polls.
        job = await run_in_threadpool(_read_job, session, auth.project_id, job_id)
        if wait <= 0 or job.status in TERMINAL_STATUSES:
            return _job_response(job, 200)
        initial = job.status
        deadline = time.monotonic() + wait
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or await request.is_disconnected():
                break
            if subscription is not None and notifier is not None and notifier.connected:
                # Woken by NOTIFY; the database is re-checked only on a wake-up or, as a
                # fallback, every notify_fallback_seconds.
                await subscription.wait(min(settings.notify_fallback_seconds, remaining))
            else:
                await asyncio.sleep(min(settings.long_poll_interval_seconds, remaining))
            status = await run_in_threadpool(_probe_status, session, auth.project_id, job_id)
            if status is None or status != initial:
                break
        job = await run_in_threadpool(_read_job, session, auth.project_id, job_id)
        return _job_response(job, 200)
    finally:
        if subscription is not None:
            subscription.close()


def _read_job(session: Any, project_id: uuid.UUID, job_id: uuid.UUID) -> JobOut:
    try:
        return service.get_job(session, project_id, job_id)
    finally:
        session.commit()


def _probe_status(session: Any, project_id: uuid.UUID, job_id: uuid.UUID) -> str | None:
    try:
        return service.job_status(session, project_id, job_id)
    finally:
        session.commit()


@router.post(
    "/{job_id}/cancel",
    name="cancel_job",
    response_model=JobOut,
    status_code=202,
    summary="Cancel a job",
    responses={
        200: {"model": JobOut, "description": "The job was queued: it is cancelled now"},
        202: {"description": "The job is running: it is `cancelling` until its worker stops"},
        **problem_responses(401, 404, 422, 500, _409="The job already finished"),
    },
)
def cancel_job(job_id: uuid.UUID, session: SessionDep, auth: ProjectDep) -> Response:
    """Queued → ``cancelled`` at once (200); running → ``cancelling`` (202); terminal → 409."""
    job = service.cancel_job(session, auth.project_id, job_id)
    return _job_response(job, 200 if job.status == "cancelled" else 202)


@router.get(
    "/{job_id}/recommendation",
    name="get_job_recommendation",
    response_model=Recommendation,
    summary="The recommendation of a succeeded plan/analyze/sweep job (the budget first)",
    responses={
        200: {
            "description": "`result.recommendation` of the job",
            "content": {"application/json": {"example": RECOMMENDATION_EXAMPLE}},
        },
        **problem_responses(401, 404, 422, 500, _409="The job has not succeeded (yet)"),
    },
)
def get_job_recommendation(job_id: uuid.UUID, session: SessionDep, auth: ProjectDep) -> Response:
    """``result.recommendation``; a 409 problem while the job has not succeeded."""
    recommendation = service.get_recommendation(session, auth.project_id, job_id)
    return Response(
        recommendation.model_dump_json(exclude_unset=True), media_type="application/json"
    )

"""Job store operations on the ``job`` table (SQLAlchemy Core: one round trip per call).

Every function is scoped to a project: a job of another project is "not found".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from pydantic import JsonValue
from sqlalchemy import Row, Table, and_, or_, select, tuple_
from sqlalchemy.orm import Session

from curvplan.types.jobs import (
    JOB_KINDS,
    JOB_STATUSES,
    TERMINAL_STATUSES,
    JobChild,
    JobCreateModel,
    JobLinks,
    JobOut,
    JobPage,
    kind_name,
)
from curvplan.types.planner import Recommendation
from curvplan_core.jobs import lifecycle
from curvplan_core.jobs.models import Job
from curvplan_core.jobs.records import QueuedRow
from curvplan_server.problems import Problem, conflict, not_found, validation_problem

JOB = cast(Table, Job.__table__)
_OUT_COLUMNS = [
    JOB.c.id,
    JOB.c.parent_id,
    JOB.c.kind,
    JOB.c.queue,
    JOB.c.status,
    JOB.c.name,
    JOB.c.tags,
    JOB.c.progress,
    JOB.c.attempt,
    JOB.c.max_attempts,
    JOB.c.cancel_requested,
    JOB.c.result,
    JOB.c.error,
    JOB.c.created_at,
    JOB.c.updated_at,
    JOB.c.started_at,
    JOB.c.finished_at,
]
_OUT_WITH_REQUEST = [*_OUT_COLUMNS, JOB.c.request, JOB.c.request_hash]


@dataclass(frozen=True, slots=True)
class _RawRow:
    """A psycopg tuple as a mapping, so :func:`job_out` reads both kinds of rows."""

    _mapping: QueuedRow


def canonical_hash(body: Mapping[str, object]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a validated body."""
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def job_out(row: Row[Any] | Any) -> JobOut:
    """The API representation of a job row: its response model, validated (the result as
    its kind's result model). ``request`` is set only when the row holds it (not in list
    pages); :func:`job_json` leaves out what is not set."""
    m = row._mapping
    base = f"/v1/jobs/{m['id']}"
    job = JobOut(
        id=m["id"],
        parent_id=m.get("parent_id"),
        kind=m["kind"],
        queue=m["queue"],
        status=m["status"],
        name=m["name"],
        tags=m["tags"] or {},
        progress=m["progress"],
        attempt=m["attempt"],
        max_attempts=m["max_attempts"],
        cancel_requested=m["cancel_requested"],
        result=m["result"],
        error=m["error"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        links=JobLinks(self=base, cancel=f"{base}/cancel", recommendation=f"{base}/recommendation"),
    )
    if "request" in m:
        job.request = m["request"]
    return job


def job_json(job: JobOut | JobPage) -> bytes:
    """A job (or a page of them) as the API's JSON: every field it was built with, stored
    results and progress exactly as stored (nothing a kind's result model leaves unset)."""
    return job.model_dump_json(exclude_unset=True).encode()


@dataclass(frozen=True, slots=True)
class Created:
    """Outcome of :func:`create_job`: the job and whether it is an idempotent replay."""

    job: JobOut
    replayed: bool


def stored_request(model: JobCreateModel) -> dict[str, JsonValue]:
    """What the job row stores of a validated body: its create model's JSON, with only the
    fields the client set (and those the API completed) — what the worker parses back."""
    return model.model_dump(mode="json", exclude_unset=True)


def create_job(
    session: Session,
    project_id: uuid.UUID,
    model: JobCreateModel,
    *,
    default_max_attempts: int,
    idempotency_key: str | None = None,
) -> Created:
    """Insert a queued job (one statement); with an idempotency key, replay or refuse reuse.

    ``model`` is the validated request, stored as its JSON (:func:`stored_request`). Same
    key + same body returns the original response again (``replayed=True``, see
    :func:`original_response`); same key + another body raises a 422 problem
    (draft-ietf-httpapi-idempotency-key-header §2.7). The artifacts the body names are
    linked to the new job (``job_artifact``) in the same transaction.
    """
    body = stored_request(model)
    request_hash = canonical_hash(body)
    kind = kind_name(type(model))
    max_attempts = model.max_attempts or default_max_attempts
    queued = lifecycle.queue_job(
        session.connection(),
        job_id=uuid.uuid4(),
        project_id=project_id,
        kind=kind,
        name=model.name,
        tags=model.tags,
        request=body,
        request_hash=request_hash,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
    )
    if queued is not None:
        queued["request"] = body  # what was just stored; no need to read it back
        return Created(job_out(_RawRow(queued)), replayed=False)
    existing = session.execute(
        select(*_OUT_WITH_REQUEST).where(
            JOB.c.project_id == project_id, JOB.c.idempotency_key == idempotency_key
        )
    ).one()
    if existing.request_hash != request_hash:
        raise Problem(
            422,
            "this Idempotency-Key was already used with a different request body; "
            "use a new key for a new request",
            title="Idempotency Key Reused",
            errors=[
                {
                    "field": "header.Idempotency-Key",
                    "loc": ["header", "Idempotency-Key"],
                    "message": "key already used with a different body",
                    "type": "idempotency_key_reused",
                }
            ],
            extra={"job_id": str(existing.id)},
        )
    return Created(original_response(existing), replayed=True)


def fan_out_at_submission(
    session: Session, project_id: uuid.UUID, created: Created, fan_out: Any
) -> Created:
    """Insert the children of a just-created job and leave it waiting for them (same
    transaction; ``curvplan_core.jobs.lifecycle.start_waiting``); the job as it now is.
    ``fan_out.children`` are the planned children (``curvplan_core.analysis_plan``): their
    create models are stored as JSON here, at the row."""
    job_id = created.job.id
    children = [child.stored() for child in fan_out.children]
    lifecycle.start_waiting(
        session.connection(), job_id, children, fan_in_seconds=fan_out.fan_in_seconds
    )
    return Created(get_job(session, project_id, job_id), replayed=False)


def original_response(row: Row[Any] | Any) -> JobOut:
    """The job exactly as the first ``POST /v1/jobs`` answered it, rebuilt from the row.

    An idempotent replay repeats the original response (draft-ietf-httpapi-idempotency-
    key-header §2.6). Everything in it is fixed at creation (id, kind, queue, name, tags,
    max_attempts, request, created_at) or was the initial state, so nothing needs storing.
    """
    m = row._mapping
    initial = QueuedRow(
        id=m["id"],
        parent_id=m["parent_id"],
        kind=m["kind"],
        queue=m["queue"],
        status="queued",
        name=m["name"],
        tags=m["tags"],
        progress=None,
        attempt=0,
        max_attempts=m["max_attempts"],
        cancel_requested=False,
        result=None,
        error=None,
        created_at=m["created_at"],
        updated_at=m["created_at"],
        started_at=None,
        finished_at=None,
        request=m["request"],
    )
    return job_out(_RawRow(initial))


def get_job(session: Session, project_id: uuid.UUID, job_id: uuid.UUID) -> JobOut:
    """The job, or a 404 problem (also for another project's job)."""
    row = session.execute(
        select(*_OUT_WITH_REQUEST).where(JOB.c.id == job_id, JOB.c.project_id == project_id)
    ).first()
    if row is None:
        raise not_found("job")
    job = job_out(row)
    children = list_children(session, job_id)
    if children:
        job.children = children
    return job


def list_children(session: Session, parent_id: uuid.UUID) -> list[JobChild]:
    """The children of a job (a fan-out), oldest first: id, kind, name, status, error type,
    and a running child's stage and ETA (what ``--wait`` shows of a waiting parent)."""
    rows = session.execute(
        select(
            JOB.c.id,
            JOB.c.kind,
            JOB.c.name,
            JOB.c.status,
            JOB.c.attempt,
            JOB.c.error,
            JOB.c.progress,
        )
        .where(JOB.c.parent_id == parent_id)
        .order_by(JOB.c.created_at, JOB.c.id)
    ).all()
    out = []
    for r in rows:
        child = JobChild(
            id=r.id,
            kind=r.kind,
            name=r.name,
            status=r.status,
            attempt=r.attempt,
            error_type=(r.error or {}).get("type"),
            links={"self": f"/v1/jobs/{r.id}"},
        )
        progress = r.progress or {}
        if r.status in ("running", "cancelling") and isinstance(progress, dict):
            child.stage = progress.get("stage")
            eta = progress.get("eta_seconds")
            child.eta_seconds = eta if isinstance(eta, int | float) else None
        out.append(child)
    return out


def job_status(session: Session, project_id: uuid.UUID, job_id: uuid.UUID) -> str | None:
    """Only the status column (cheap long-poll probe); None when the job is gone."""
    return session.execute(
        select(JOB.c.status).where(JOB.c.id == job_id, JOB.c.project_id == project_id)
    ).scalar_one_or_none()


# --------------------------------------------------------------------------- listing
@dataclass(frozen=True, slots=True)
class JobFilters:
    """Validated list filters; ``fingerprint`` ties a page token to them."""

    statuses: tuple[str, ...] = ()
    kind: str | None = None
    name: str | None = None
    tags: tuple[tuple[str, str], ...] = ()

    @property
    def fingerprint(self) -> str:
        blob = json.dumps([self.statuses, self.kind, self.name, self.tags])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def query_field_error(field: str, message: str) -> Problem:
    loc: list[str | int] = ["query", field]
    return validation_problem(
        [{"field": f"query.{field}", "loc": loc, "message": message, "type": "value_error"}]
    )


def parse_filters(
    status: list[str] | None, kind: str | None, name: str | None, tag: list[str] | None
) -> JobFilters:
    """Check the list query parameters; a bad one is a 422 naming it."""
    for field, values in (("status", status or []), ("name", [name or ""]), ("tag", tag or [])):
        if any("\x00" in value for value in values):
            # PostgreSQL text cannot hold NUL: refuse it here rather than fail in the driver.
            raise query_field_error(field, "must not contain the NUL character")
    statuses: list[str] = []
    for raw in status or []:
        for part in raw.split(","):
            part = part.strip()
            if part not in JOB_STATUSES:
                raise query_field_error("status", f"unknown status {part!r}; one of {JOB_STATUSES}")
            statuses.append(part)
    if kind is not None and kind not in JOB_KINDS:
        raise query_field_error("kind", f"unknown kind {kind!r}; one of {JOB_KINDS}")
    tags: list[tuple[str, str]] = []
    for raw in tag or []:
        key, sep, value = raw.partition(":")
        if not sep or not key:
            raise query_field_error("tag", f"tag filter {raw!r} must look like key:value")
        tags.append((key, value))
    return JobFilters(tuple(sorted(set(statuses))), kind, name, tuple(sorted(tags)))


def encode_page_token(created_at: datetime, job_id: uuid.UUID, filters: JobFilters) -> str:
    """Opaque cursor: the (created_at, id) of the last item, bound to the filters."""
    blob = json.dumps({"c": created_at.isoformat(), "i": str(job_id), "f": filters.fingerprint})
    return base64.urlsafe_b64encode(blob.encode()).decode().rstrip("=")


MAX_PAGE_TOKEN_CHARS = 512  # ours are ~170; a longer one is not ours


def decode_page_token(token: str, filters: JobFilters) -> tuple[datetime, uuid.UUID]:
    """Inverse of :func:`encode_page_token`; a foreign or damaged token is a 422.

    The token comes from the client, so every part is type-checked: a crafted one
    (a number for the id, deeply nested JSON, a naive time) must be a 422, not a 500.
    """
    invalid = query_field_error("page_token", "invalid page token")
    if len(token) > MAX_PAGE_TOKEN_CHARS:
        raise invalid
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, binascii.Error, RecursionError):  # UnicodeDecodeError is a ValueError
        raise invalid from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in "cif"):
        raise invalid
    try:
        created_at = datetime.fromisoformat(data["c"])
        job_id = uuid.UUID(data["i"])
    except ValueError:
        raise invalid from None
    if created_at.tzinfo is None:
        raise invalid
    fingerprint = data["f"]
    if fingerprint != filters.fingerprint:
        raise query_field_error("page_token", "this page token was issued for other filters")
    return created_at, job_id


def list_jobs(
    session: Session,
    project_id: uuid.UUID,
    filters: JobFilters,
    *,
    page_size: int,
    page_token: str | None,
) -> JobPage:
    """A page of the project's jobs, newest first, and the token of the next page."""
    conditions = [JOB.c.project_id == project_id]
    if filters.statuses:
        conditions.append(JOB.c.status.in_(filters.statuses))
    if filters.kind is not None:
        conditions.append(JOB.c.kind == filters.kind)
    if filters.name is not None:
        conditions.append(JOB.c.name == filters.name)
    if filters.tags:
        wanted: dict[str, set[str]] = {}
        for key, value in filters.tags:
            wanted.setdefault(key, set()).add(value)
        for key, values in wanted.items():
            # several values for one key: any of them (OR); different keys: all (AND)
            conditions.append(or_(*[JOB.c.tags.contains({key: v}) for v in sorted(values)]))
    if page_token:
        created_at, last_id = decode_page_token(page_token, filters)
        conditions.append(tuple_(JOB.c.created_at, JOB.c.id) < tuple_(created_at, last_id))
    rows = session.execute(
        select(*_OUT_COLUMNS)
        .where(and_(*conditions))
        .order_by(JOB.c.created_at.desc(), JOB.c.id.desc())
        .limit(page_size + 1)
    ).all()
    items = [job_out(r) for r in rows[:page_size]]
    next_token = None
    if len(rows) > page_size:
        last = rows[page_size - 1]
        next_token = encode_page_token(last.created_at, last.id, filters)
    return JobPage(items=items, next_page_token=next_token)


# --------------------------------------------------------------------------- cancel
def cancel_job(session: Session, project_id: uuid.UUID, job_id: uuid.UUID) -> JobOut:
    """Cancel: queued → cancelled at once; running → cancelling (the worker stops it).

    Cancelling a job that is already ``cancelling`` is a no-op; a terminal job is a 409.
    A job with children (a fan-out) cancels them too; a cancelled child settles its parent
    (:func:`curvplan_core.jobs.lifecycle.cancel`).
    """
    cancelled = lifecycle.cancel(session.connection(), project_id, job_id)
    if cancelled is not None:
        if cancelled.has_children or cancelled.row.parent_id is not None:
            return get_job(session, project_id, job_id)
        return job_out(cancelled.row)
    job = get_job(session, project_id, job_id)  # 404 when missing
    if job.status == "cancelling":
        return job
    raise conflict(
        f"job is already {job.status}; only queued or running jobs can be cancelled",
        job_status=job.status,
    )


def get_recommendation(
    session: Session, project_id: uuid.UUID, job_id: uuid.UUID
) -> Recommendation:
    """``result.recommendation`` of a succeeded job (its response model); 409 problem while
    it is not succeeded."""
    row = session.execute(
        select(JOB.c.status, JOB.c.result, JOB.c.error).where(
            JOB.c.id == job_id, JOB.c.project_id == project_id
        )
    ).first()
    if row is None:
        raise not_found("job")
    if row.status != "succeeded":
        detail = f"job is {row.status}; the recommendation exists once it has succeeded"
        if row.status in TERMINAL_STATUSES:
            detail = f"job is {row.status} and has no recommendation"
        raise conflict(detail, job_status=row.status)
    recommendation = (row.result or {}).get("recommendation")
    if recommendation is None:
        raise conflict(
            "the job succeeded but its result holds no recommendation", job_status=row.status
        )
    return Recommendation.model_validate(recommendation)

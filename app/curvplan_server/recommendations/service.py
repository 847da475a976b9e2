"""The latest recommendation per job name (``DISTINCT ON (name) … ORDER BY finished_at DESC``).

A pipeline asks "what is the current budget for model X": among the project's succeeded jobs
that match the filters (kind, tags), the one of each name that finished last. Jobs without a
name cannot be asked for by name and are left out. Pages are ordered by name, and the page
token is the last name of the page bound to the filters.
"""

from __future__ import annotations

import uuid

from sqlalchemy import and_, or_, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session

from curvplan.types.recommendations import (
    LatestRecommendation,
    RecommendationLinks,
    RecommendationPage,
)
from curvplan_core.jobs.models import Job
from curvplan_server.jobs.service import JobFilters
from curvplan_server.paging import decode_page_token, encode_page_token, page_token_problem

JOB = Job.__table__


def _encode(last_name: str, filters: JobFilters) -> str:
    return encode_page_token({"n": last_name, "f": filters.fingerprint})


def _decode(token: str, filters: JobFilters) -> str:
    """The last name of a token we issued; anything else (crafted, damaged) is a 422."""
    data = decode_page_token(token, ("n", "f"))
    if data["f"] != filters.fingerprint:
        raise page_token_problem("this page token was issued for other filters")
    return data["n"]


def latest_recommendations(
    session: Session,
    project_id: uuid.UUID,
    filters: JobFilters,
    *,
    page_size: int,
    page_token: str | None,
) -> RecommendationPage:
    """One item per job name: that name's most recently finished succeeded job."""
    conditions = [
        JOB.c.project_id == project_id,
        JOB.c.status == "succeeded",
        JOB.c.name.is_not(None),
        JOB.c.result["recommendation"].is_not(None),
    ]
    if filters.kind is not None:
        conditions.append(JOB.c.kind == filters.kind)
    if filters.name is not None:
        conditions.append(JOB.c.name == filters.name)
    wanted: dict[str, set[str]] = {}
    for key, value in filters.tags:
        wanted.setdefault(key, set()).add(value)
    for key, values in wanted.items():
        conditions.append(or_(*[JOB.c.tags.contains({key: v}) for v in sorted(values)]))
    if page_token:
        conditions.append(JOB.c.name > _decode(page_token, filters))
    rows = session.execute(
        select(
            JOB.c.id,
            JOB.c.name,
            JOB.c.kind,
            JOB.c.tags,
            JOB.c.finished_at,
            JOB.c.result["recommendation"].label("recommendation"),
        )
        .where(and_(*conditions))
        .ext(distinct_on(JOB.c.name))
        .order_by(JOB.c.name, JOB.c.finished_at.desc(), JOB.c.id.desc())
        .limit(page_size + 1)
    ).all()
    items = [
        LatestRecommendation(
            name=row.name,
            job_id=row.id,
            kind=row.kind,
            tags=row.tags or {},
            finished_at=row.finished_at,
            budget=(row.recommendation or {}).get("budget"),
            recommendation=row.recommendation,
            links=RecommendationLinks(
                job=f"/v1/jobs/{row.id}", recommendation=f"/v1/jobs/{row.id}/recommendation"
            ),
        )
        for row in rows[:page_size]
    ]
    token = _encode(rows[page_size - 1].name, filters) if len(rows) > page_size else None
    return RecommendationPage(items=items, next_page_token=token)

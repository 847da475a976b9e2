"""What the agent routes do: register an agent, claim a point of the project's agent sweeps,
and the attempt's fenced writes (heartbeat, complete, fail, cancelled, release).

An agent is a row of ``worker`` (queues ``["agent"]``, so ``GET /v1/workers`` lists it and the
workers' reaper marks it stale and re-queues its points when it stops beating). It claims only
jobs of its caller's project from the agent queue (:data:`~curvplan.types.jobs.AGENT_QUEUE`),
and every write after a claim is fenced on ``(agent id, attempt)`` by the state machine's own
functions (:mod:`curvplan_core.jobs.lifecycle`), exactly as a worker's: a write that no longer
holds the lease matches nothing and answers 409.
"""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

from curvplan.types.agents import (
    AgentClaimOut,
    AgentComplete,
    AgentEnd,
    AgentFail,
    AgentHeartbeat,
    AgentHeartbeatOut,
    AgentJob,
    AgentOut,
    AgentProgress,
    AgentRegister,
)
from curvplan.types.jobs import AGENT_QUEUE, SweepPointJobCreate
from curvplan.types.options import STORED_REQUEST
from curvplan_core.config import Settings
from curvplan_core.jobs import lifecycle, store
from curvplan_core.jobs.errors import error_dict
from curvplan_core.jobs.store import Fence
from curvplan_core.sweep_points import point_result
from curvplan_server.problems import Problem, conflict, not_found

AGENT_KIND = "sweep_point"


def heartbeat_seconds(lease_seconds: float) -> float:
    """How often an agent beats: a third of its lease (two beats may be lost)."""
    return lease_seconds / 3.0


def register(session: Session, project: str, body: AgentRegister, settings: Settings) -> AgentOut:
    """Insert the agent's ``worker`` row; its id is random (it fences the agent's writes)."""
    agent_id = f"agent-{uuid.uuid4().hex}"
    store.register_worker(
        session.connection(),
        agent_id,
        body.hostname,
        body.pid,
        [AGENT_QUEUE],
    )
    lease = settings.lease_seconds
    return AgentOut(
        id=agent_id,
        project=project,
        lease_seconds=lease,
        heartbeat_seconds=heartbeat_seconds(lease),
    )


def _check_agent(session: Session, agent_id: str) -> None:
    row = session.execute(
        text("SELECT queues FROM worker WHERE id = :id"), {"id": agent_id}
    ).one_or_none()
    if row is None or list(row.queues) != [AGENT_QUEUE]:
        raise not_found("agent")


def claim(
    session: Session,
    project_id: uuid.UUID,
    agent_id: str,
    lease_seconds: float | None,
    settings: Settings,
) -> AgentClaimOut:
    """Claim the oldest runnable point of the project's agent sweeps, or none."""
    _check_agent(session, agent_id)
    conn = session.connection()
    lease = lease_seconds or settings.lease_seconds
    row = lifecycle.claim_agent_point(conn, project_id, agent_id, lease)
    if row is None:
        store.touch_worker(conn, agent_id, "running", None)
        return AgentClaimOut(job=None)
    request = SweepPointJobCreate.model_validate(row.request, context=STORED_REQUEST)
    limit = settings.job_time_limit(AGENT_KIND)
    return AgentClaimOut(
        job=AgentJob(
            job_id=row.id,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            name=row.name,
            sweep_id=row.parent_id,
            point=request.point,
            optimizer=request.optimizer,
            time_limit_seconds=float(limit),
            lease_expires_at=row.lease_expires_at,
        )
    )


def _fence(
    session: Session, project_id: uuid.UUID, agent_id: str, job_id: uuid.UUID, attempt: int
) -> Fence:
    """The attempt's fence, after checking that the job is a point of the caller's project
    (404 otherwise: another project's job is not there)."""
    _check_agent(session, agent_id)
    kind = session.execute(
        text("SELECT kind FROM job WHERE id = :id AND project_id = :p"),
        {"id": job_id, "p": project_id},
    ).scalar_one_or_none()
    if kind != AGENT_KIND:
        raise not_found("job")
    return Fence(job_id=job_id, worker_id=agent_id, attempt=attempt)


def _lease_lost(session: Session, fence: Fence) -> Problem:
    row = session.execute(
        text("SELECT status, attempt, worker_id FROM job WHERE id = :id"), {"id": fence.job_id}
    ).one()
    holder = "this agent" if row.worker_id == fence.worker_id else "another agent or nobody"
    return conflict(
        f"attempt {fence.attempt} of the point no longer holds its lease (the point is "
        f"{row.status} at attempt {row.attempt}, held by {holder}): the lease ran out and the "
        "point was queued again, or it ended; stop the command and drop this attempt",
        job_status=row.status,
        attempt=row.attempt,
    )


def heartbeat(
    session: Session,
    project_id: uuid.UUID,
    agent_id: str,
    job_id: uuid.UUID,
    body: AgentHeartbeat,
    settings: Settings,
) -> AgentHeartbeatOut:
    """Renew the lease and write progress (fenced); 409 when the lease was lost."""
    fence = _fence(session, project_id, agent_id, job_id, body.attempt)
    conn = session.connection()
    lease = body.lease_seconds or settings.lease_seconds
    progress = None if body.progress is None else body.progress.model_dump(exclude_none=True)
    beat = store.heartbeat(conn, fence, lease, progress)
    if beat is None:
        raise _lease_lost(session, fence)
    store.touch_worker(conn, agent_id, "running", job_id)
    return AgentHeartbeatOut(
        status=beat.status, cancel_requested=beat.cancel_requested, lease_seconds=lease
    )


def _ended(session: Session, fence: Fence, status: str | None) -> AgentEnd:
    if status is None:
        raise _lease_lost(session, fence)
    return AgentEnd(job_id=fence.job_id, status=status)  # type: ignore[arg-type]


def complete(
    session: Session, project_id: uuid.UUID, agent_id: str, job_id: uuid.UUID, body: AgentComplete
) -> AgentEnd:
    """The command finished: its records become the point's result (the built-in loop's
    schema), ``running → succeeded`` (fenced; a point whose cancel was asked ends cancelled)."""
    fence = _fence(session, project_id, agent_id, job_id, body.attempt)
    stored = session.execute(
        text("SELECT request FROM job WHERE id = :id"), {"id": job_id}
    ).scalar_one()
    request = SweepPointJobCreate.model_validate(stored, context=STORED_REQUEST)
    result = point_result(request.point, body.records, body.seconds)
    reached = (
        f", target reached at step {result.steps:.4g}"
        if result.reached_target
        else (" (censored: the target was not reached)" if result.censored else "")
    )
    progress = AgentProgress(
        fraction=1.0,
        stage="done",
        message=f"{len(result.eval_steps)} evaluations from the agent's command{reached}",
    )
    status = lifecycle.mark_succeeded(
        session.connection(),
        fence,
        result={"point": result.model_dump(mode="json")},
        progress=progress.model_dump(),
    )
    return _ended(session, fence, status)


def fail(
    session: Session,
    project_id: uuid.UUID,
    agent_id: str,
    job_id: uuid.UUID,
    body: AgentFail,
    settings: Settings,
) -> AgentEnd:
    """The attempt failed: for good (``retry: false``), or queued again with backoff while
    attempts remain (``retry: true``, as a worker's crashed attempt); fenced."""
    fence = _fence(session, project_id, agent_id, job_id, body.attempt)
    conn = session.connection()
    error = body.error
    if body.retry:
        status = lifecycle.requeue_for_retry(
            conn,
            fence,
            detail=f"{error.title}: {error.detail}"[:4000],
            backoff_base=settings.retry_backoff_base_seconds,
            backoff_max=settings.retry_backoff_max_seconds,
            error_type=error.type,
            title=error.title,
        )
    else:
        status = lifecycle.fail(
            conn, fence, error=error_dict(error.type, error.title, error.detail)
        )
    return _ended(session, fence, status)


def cancelled(
    session: Session, project_id: uuid.UUID, agent_id: str, job_id: uuid.UUID, attempt: int
) -> AgentEnd:
    """The command stopped on the point's cancel: ``cancelling → cancelled`` (fenced)."""
    fence = _fence(session, project_id, agent_id, job_id, attempt)
    return _ended(session, fence, lifecycle.mark_cancelled(session.connection(), fence))


def release(
    session: Session, project_id: uuid.UUID, agent_id: str, job_id: uuid.UUID, attempt: int
) -> AgentEnd:
    """The agent stops before the command finished: the point is queued again at once,
    without using up an attempt (fenced)."""
    fence = _fence(session, project_id, agent_id, job_id, attempt)
    return _ended(session, fence, lifecycle.release(session.connection(), fence))


def stop(session: Session, agent_id: str) -> None:
    """The agent exits: its row is ``stopped``."""
    _check_agent(session, agent_id)
    store.stop_worker(session.connection(), agent_id)

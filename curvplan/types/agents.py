"""``curvplan agent``: the loss records a training command reports, and the agent endpoints'
bodies (``/v1/agents``; docs/budget.md#sweeps-with-your-own-trainer).

An agent is a client process of a project (its API key) that claims the points of the
project's agent sweeps (``runner: agent``), runs the team's own training command for each and
reports the command's evaluation losses. Every write after a claim is fenced on the agent and
the attempt: one that no longer holds the point's lease gets a 409 and must abandon it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from curvplan.types.sweep import OptimizerSpec, PointSettings

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def _storable(value: str) -> str:
    """Text the database can store: no NUL character, valid UTF-8 (no lone surrogate)."""
    if "\x00" in value:
        raise ValueError("must not contain the NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (a lone surrogate is not)") from None
    return value


Text = Annotated[str, AfterValidator(_storable)]
MAX_LOSS_RECORDS = 100_000


class LossRecord(BaseModel):
    """One evaluation of a training run: ``{"step": …, "loss": …, "examples": …}``, one JSON
    object a line (the agent protocol; :mod:`curvplan.losslog` writes them)."""

    model_config = ConfigDict(extra="ignore")

    step: Annotated[int, Field(ge=0)] = Field(description="Optimizer steps taken.")
    loss: FiniteFloat = Field(description="Held-out evaluation loss (nats per token).")
    examples: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        default=None, description="Training examples processed so far (optional)."
    )
    tokens: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        default=None, description="Training tokens processed so far (optional)."
    )


class AgentRegister(BaseModel):
    """``POST /v1/agents``: an agent process starts."""

    model_config = ConfigDict(extra="forbid")

    hostname: Annotated[Text, Field(min_length=1, max_length=255)]
    pid: Annotated[int, Field(ge=0, le=2**31 - 1)]


LeaseSeconds = Annotated[float, Field(ge=1, le=3600)]
LEASE_DESCRIPTION = (
    "The lease the claim holds, renewed by every heartbeat (default: the service's "
    "CURVPLAN_LEASE_SECONDS). A killed agent's point is queued again once it runs out."
)


class AgentClaim(BaseModel):
    """``POST /v1/agents/{id}/claim``."""

    model_config = ConfigDict(extra="forbid")

    lease_seconds: LeaseSeconds | None = Field(default=None, description=LEASE_DESCRIPTION)


class AgentOut(BaseModel):
    """A registered agent: its id (the fence of every later call) and its lease."""

    id: str
    project: str = Field(description="The project whose agent sweeps the agent trains.")
    lease_seconds: float
    heartbeat_seconds: float = Field(description="How often to beat: a third of the lease.")


class AgentJob(BaseModel):
    """A point an agent has claimed: what to train, and the attempt that fences its writes."""

    job_id: uuid.UUID
    attempt: int
    max_attempts: int
    name: str | None
    sweep_id: uuid.UUID | None = Field(description="The sweep the point belongs to.")
    point: PointSettings
    optimizer: OptimizerSpec
    time_limit_seconds: float = Field(
        description="The attempt's time limit (CURVPLAN_JOB_TIME_LIMITS for sweep_point): the "
        "agent stops the command then and fails the point with error type `timeout`."
    )
    lease_expires_at: datetime


class AgentClaimOut(BaseModel):
    """``POST /v1/agents/{id}/claim``: the claimed point, or null when none is runnable."""

    job: AgentJob | None


class AgentProgress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fraction: Annotated[float, Field(ge=0, le=1)] | None = None
    stage: Annotated[Text, Field(max_length=200)] | None = None
    message: Annotated[Text, Field(max_length=2000)] | None = None


class AgentAttempt(BaseModel):
    """The fence of a write: the attempt the agent claimed."""

    model_config = ConfigDict(extra="forbid")

    attempt: Annotated[int, Field(ge=1, le=1000)]


class AgentHeartbeat(AgentAttempt):
    """``POST /v1/agents/{id}/jobs/{job_id}/heartbeat``: renew the lease, report progress."""

    progress: AgentProgress | None = None
    lease_seconds: LeaseSeconds | None = Field(default=None, description=LEASE_DESCRIPTION)


class AgentHeartbeatOut(BaseModel):
    """The point's status after the beat; ``cancel_requested``: stop the command."""

    status: str
    cancel_requested: bool
    lease_seconds: float


class AgentComplete(AgentAttempt):
    """``POST …/complete``: the command exited 0 with these evaluations; the service turns
    them into the point's result (the built-in loop's schema, ``SweepPointJobResult``)."""

    records: Annotated[list[LossRecord], Field(min_length=1, max_length=MAX_LOSS_RECORDS)]
    seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        description="Wall-clock seconds the command ran."
    )


class AgentFailure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[a-z0-9\-]+$")]
    title: Annotated[Text, Field(max_length=200)]
    detail: Annotated[Text, Field(max_length=8000)] = ""


class AgentFail(AgentAttempt):
    """``POST …/fail``: the attempt failed. ``retry: false`` (the command's own error, a time
    limit) fails the point; ``retry: true`` (the command was killed by a signal the agent did
    not send) queues it again with backoff while attempts remain, as the workers do."""

    error: AgentFailure
    retry: bool = False


class AgentEnd(BaseModel):
    """The point's status after an attempt's end."""

    job_id: uuid.UUID
    status: Literal["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]

"""The JSON objects of a job row as the queue reads and writes them.

``request`` and ``result`` hold a kind's create model and result model as JSON (the core
passes them through: ``dict[str, JsonValue]``); ``error`` and ``progress`` are written by the
queue and the worker in the shapes below, which ``curvplan.types.jobs.JobError`` and
``Progress`` read.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import NotRequired, TypedDict

from pydantic import JsonValue


class ErrorRecord(TypedDict):
    """``job.error``: a stable type (``worker-lost``, ``timeout``, …), a title, a detail."""

    type: str
    title: str | None
    detail: str | None


class StageRecord(TypedDict):
    """One stage the attempt entered, and when (ISO 8601)."""

    stage: str
    started_at: str


class ProgressRecord(TypedDict, total=False):
    """``job.progress``: where a running job is (``curvplan.types.jobs.Progress``), and for a
    fan-out waiting for its children their counts and its fan-in's own estimate."""

    fraction: float | None
    stage: str | None
    message: str | None
    stages: list[StageRecord]
    eta_seconds: float | None
    points_done: int
    points_total: int
    points_failed: int
    fan_in_seconds: float


class NewChild(TypedDict):
    """A child job a fan-out inserts: its kind, its request (a valid create body) and name;
    optionally its attempts and its prior estimate of seconds (its progress until it runs)."""

    kind: str
    request: dict[str, JsonValue]
    name: NotRequired[str | None]
    max_attempts: NotRequired[int]
    eta_seconds: NotRequired[float]


class FanOutRecord(TypedDict):
    """What an attempt that fanned out sends its worker: the children and a message."""

    children: list[NewChild]
    message: str


class ChildRecord(TypedDict):
    """A child of a fan-out with its outcome, as its parent's fan-in sees it."""

    id: str
    kind: str
    name: str | None
    status: str
    request: dict[str, JsonValue]
    result: dict[str, JsonValue] | None
    error: ErrorRecord | None
    attempt: int


class QueuedRow(TypedDict):
    """A job row as the API answers it (``lifecycle.QUEUED_COLUMNS``, as psycopg reads them):
    what :func:`curvplan_core.jobs.lifecycle.queue_job` returns, ``request`` added by the
    caller (what it just stored)."""

    id: uuid.UUID
    parent_id: uuid.UUID | None
    kind: str
    queue: str
    status: str
    name: str | None
    tags: dict[str, str] | None
    progress: ProgressRecord | None
    attempt: int
    max_attempts: int
    cancel_requested: bool
    result: dict[str, JsonValue] | None
    error: ErrorRecord | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    request: NotRequired[dict[str, JsonValue]]

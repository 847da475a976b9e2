"""RFC 9457 problem details: the body of every error response (``application/problem+json``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from pydantic import BaseModel, Field

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://curvplan.dev/problems/"


class FieldError(BaseModel):
    """One failing input field: where it is, what went wrong, the pydantic error type."""

    field: str = Field(description="Dotted path of the failing input, e.g. body.targets.radius")
    loc: list[str | int]
    message: str
    type: str


class FieldErrorEntry(TypedDict):
    """:class:`FieldError` as the code that builds a problem, or reads one, holds it."""

    field: str
    loc: Sequence[str | int]
    message: str
    type: str


class ProblemDocument(BaseModel):
    """The RFC 9457 body; ``errors`` is present on validation failures."""

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldError] | None = None
    errors_omitted: int | None = Field(
        default=None, description="Field errors left out of `errors` (it lists at most 100)."
    )

"""What a job kind's ``run`` sees and returns: its :class:`JobContext`, and a :class:`FanOut`
of :class:`ChildJob` s instead of a result (docs in :mod:`curvplan_worker.kinds`); in its
fan-in, its children's outcomes as :class:`ChildOutcome` s (:meth:`JobContext.children_as`).

Below the kinds and the analyze pipeline alike, so that neither imports the other for these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, JsonValue

from curvplan.types.huggingface import HuggingFaceModel
from curvplan.types.jobs import JobError as ChildError
from curvplan.types.spec import ModelSpec
from curvplan_core.jobs.records import ChildRecord, NewChild
from curvplan_worker.curvature.limits import AttemptLimits
from curvplan_worker.errors import JobCancelled

RequestT = TypeVar("RequestT", bound=BaseModel)
ResultT = TypeVar("ResultT", bound=BaseModel)


@dataclass(frozen=True)
class ChildJob(Generic[RequestT]):
    """One child job of a fan-out: its request (a create model of the contract, validated
    when built) and a name."""

    request: RequestT
    name: str | None = None

    def stored(self) -> NewChild:
        """``{kind, request, name}`` as the worker inserts the child (the request's JSON)."""
        request: dict[str, JsonValue] = self.request.model_dump(mode="json", exclude_none=True)
        return NewChild(kind=str(request["kind"]), request=request, name=self.name)


@dataclass(frozen=True)
class ChildOutcome(Generic[RequestT, ResultT]):
    """One child's outcome as its parent's fan-in reads it: the row's id, name, status and
    attempt, its request as its kind's create model, its result as its kind's result model
    (``curvplan.types.results``; None unless it succeeded with one) and its error."""

    id: str
    kind: str
    name: str | None
    status: str
    attempt: int
    request: RequestT
    result: ResultT | None
    error: ChildError | None

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded" and self.result is not None

    @classmethod
    def parse(
        cls,
        record: Mapping[str, Any],
        request_type: type[RequestT],
        result_type: type[ResultT],
        model: ModelSpec | HuggingFaceModel | None = None,
    ) -> ChildOutcome[RequestT, ResultT]:
        """A stored child record (``curvplan_core.jobs.fanout.children_of``) parsed once.

        ``model``: the parent's parsed model. A fan-out's children carry their parent's model
        (the admission and the kinds copy it); where the stored one is exactly its JSON, the
        parent's object is used instead of parsing the same spec again."""
        request = dict(record["request"])
        if model is not None and request.get("model") == model.model_dump(
            mode="json", exclude_none=True
        ):
            request["model"] = model
        result = record.get("result")
        error = record.get("error")
        return cls(
            id=str(record["id"]),
            kind=str(record["kind"]),
            name=record.get("name"),
            status=str(record["status"]),
            attempt=int(record.get("attempt") or 0),
            request=request_type.model_validate(request),
            result=None if not result else result_type.model_validate(result),
            error=None if not error else ChildError.model_validate(error),
        )


@dataclass(frozen=True)
class FanOut:
    """What a kind returns to run child jobs first; it is run again when they have ended."""

    children: Sequence[ChildJob[Any]]
    message: str = ""


class JobContext:
    """What a running kind sees of its job: ids, data directory, the API (remote workers),
    progress and cancel."""

    def __init__(
        self,
        *,
        job_id: str,
        attempt: int,
        data_dir: Path,
        send_progress: Callable[..., None],
        is_cancelled: Callable[[], bool],
        children: list[ChildRecord] | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
        limits: AttemptLimits | None = None,
    ) -> None:
        #: The worker's memory and time limits for this attempt (docs/operations.md#memory-limit).
        self.limits = limits
        #: The children's outcomes in a fan-in attempt (``id``, ``kind``, ``name``,
        #: ``status``, ``request``, ``result``, ``error``), oldest first; None otherwise.
        self.children = children
        #: The API and this worker's key, on a worker on another host (blobs go through the
        #: API: ``curvplan_worker.analyze.artifacts.ArtifactAccess``); None on one host.
        self.api_url = api_url
        self.api_key = api_key
        self.job_id = job_id
        self.attempt = attempt
        self.data_dir = data_dir
        self._send_progress = send_progress
        self._is_cancelled = is_cancelled

    def children_as(
        self,
        request_type: type[RequestT],
        result_type: type[ResultT],
        model: ModelSpec | HuggingFaceModel | None = None,
    ) -> list[ChildOutcome[RequestT, ResultT]]:
        """The children's outcomes typed (:meth:`ChildOutcome.parse`), oldest first; empty
        outside a fan-in."""
        return [
            ChildOutcome.parse(record, request_type, result_type, model)
            for record in self.children or []
        ]

    def report_progress(
        self, fraction: float, stage: str, message: str = "", *, eta_seconds: float | None = None
    ) -> None:
        """Publish progress (``0 ≤ fraction ≤ 1``, and the seconds the job still needs when it
        has an estimate); raise JobCancelled if cancel was requested."""
        if not (isinstance(fraction, int | float) and math.isfinite(fraction)):
            raise ValueError(f"progress fraction must be a finite number, got {fraction!r}")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress fraction must lie in [0, 1], got {fraction}")
        self.check_cancelled()
        eta = None
        if eta_seconds is not None and math.isfinite(eta_seconds):
            eta = max(float(eta_seconds), 0.0)
        self._send_progress(float(fraction), str(stage), str(message), eta)

    def check_cancelled(self) -> None:
        """Raise JobCancelled if the job's cancellation was requested (no progress sent)."""
        if self._is_cancelled():
            raise JobCancelled()

"""What a job kind's ``run`` sees and returns: its :class:`JobContext`, and a :class:`FanOut`
of :class:`ChildJob` s instead of a result (docs in :mod:`curvplan_worker.kinds`).

Below the kinds and the analyze pipeline alike, so that neither imports the other for these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from curvplan_worker.curvature.limits import AttemptLimits
from curvplan_worker.errors import JobCancelled

RequestT = TypeVar("RequestT", bound=BaseModel)


@dataclass(frozen=True)
class ChildJob(Generic[RequestT]):
    """One child job of a fan-out: its request (a create model of the contract, validated
    when built) and a name."""

    request: RequestT
    name: str | None = None

    def stored(self) -> dict[str, Any]:
        """``{kind, request, name}`` as the worker inserts the child (the request's JSON)."""
        request = self.request.model_dump(mode="json", exclude_none=True)
        return {"kind": request["kind"], "request": request, "name": self.name}


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
        children: list[dict[str, Any]] | None = None,
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

"""Job kinds: ``kind name → run(request: XJobCreate, ctx: JobContext) -> dict``.

A kind module exposes ``run``. It is imported lazily, in the child process that runs
the attempt (and preloaded in the forkserver), never in the worker parent, so a kind
may import torch without the parent paying for it.

``run`` receives the kind's validated create model (``curvplan.types.jobs``), parsed once
from the stored request's JSON by :func:`load_request` in the attempt child: a kind reads
typed fields and never re-validates its request.

A kind reports progress with ``ctx.report_progress(fraction, stage, message)``; that
call raises :class:`curvplan_worker.errors.JobCancelled` once the job's cancellation was
requested, which is how cancel reaches a running job (cooperatively). A kind raises
:class:`curvplan_worker.errors.JobError` for a failure it diagnosed (bad input, …): the job
fails with that error and is not retried.

Fan-out: instead of a result dict a kind may return :class:`FanOut` (child jobs to
create). The job then waits for its children (``curvplan_core.jobs.fanout``) and is run
again once they have all ended, this time with ``ctx.children`` holding their outcomes:
that second run (the fan-in) returns the job's result.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from curvplan.types.jobs import CREATE_TYPE_OF_KIND, parse_stored_request
from curvplan_worker.curvature.limits import AttemptLimits
from curvplan_worker.errors import JobCancelled, JobError

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


@dataclass(frozen=True)
class KindSpec:
    """Where a kind's code lives, which queue its jobs go to and the model of its request."""

    name: str
    queue: str
    module: str
    request_type: type[BaseModel]


#: Derived from the contract's registry: kind ``x`` runs ``curvplan_worker.kinds.x.run`` on
#: its ``XJobCreate``.
KINDS: dict[str, KindSpec] = {
    name: KindSpec(name=name, queue=t.queue, module=f"{__name__}.{name}", request_type=t)
    for name, t in CREATE_TYPE_OF_KIND.items()
}


class UnknownKindError(LookupError):
    """The job names a kind this worker does not know."""


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


RunFunction = Callable[[Any, JobContext], "dict[str, Any] | FanOut"]
"""A kind's ``run``: its create model (typed per kind) and the context → result or fan-out."""


def kind_spec(name: str) -> KindSpec:
    """The spec of kind ``name``; UnknownKindError if there is none."""
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownKindError(
            f"unknown job kind {name!r}; this worker runs {sorted(KINDS)}"
        ) from None


def load_request(name: str, stored: str | bytes) -> BaseModel:
    """The stored request of a job of kind ``name`` (its JSON) as the kind's create model,
    parsed once; a request that does not validate (a row edited by hand, a kind's rules
    tightened since it was queued) is a JobError naming the first failing field."""
    try:
        return parse_stored_request(kind_spec(name).request_type, stored)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first["loc"]) or "request"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise JobError(
            "invalid-request", f"Invalid {name} request", f"{field}: {first['msg']}{more}"[:300]
        ) from None


def load_run(name: str) -> RunFunction:
    """Import kind ``name`` and return its ``run`` function."""
    module = importlib.import_module(kind_spec(name).module)
    return module.run


def modules_for_queues(queues: Iterable[str]) -> list[str]:
    """The kind modules serving ``queues`` (what the forkserver preloads)."""
    wanted = set(queues)
    return [spec.module for spec in KINDS.values() if spec.queue in wanted]

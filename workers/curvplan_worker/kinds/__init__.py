"""Job kinds: ``kind name → run(request: XJobCreate, ctx: JobContext) -> XResult``.

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

The context and the fan-out types live in :mod:`curvplan_worker.job_context`.

``run`` returns the kind's result model (the create model's ``result_type``,
``curvplan.types.results``); the attempt child checks it is one and validates its JSON before
the worker writes it (:func:`curvplan.types.results.stored_result`).

Fan-out: instead of its result a kind may return a ``FanOut`` (child jobs to
create). The job then waits for its children (``curvplan_core.jobs.fanout``) and is run
again once they have all ended, this time with ``ctx.children`` holding their outcomes:
that second run (the fan-in) reads them typed, with ``ctx.children_as(request type, result
type, model)`` (each child's create model and ``curvplan.types.results`` model, parsed once),
and returns the job's result.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from curvplan.types.jobs import CREATE_TYPE_OF_KIND, parse_stored_request
from curvplan_worker.errors import JobError
from curvplan_worker.job_context import FanOut, JobContext


@dataclass(frozen=True)
class KindSpec:
    """Where a kind's code lives, which queue its jobs go to and the models of its request
    and of its result."""

    name: str
    queue: str
    module: str
    request_type: type[BaseModel]
    result_type: type[BaseModel]


#: Derived from the contract's registry: kind ``x`` runs ``curvplan_worker.kinds.x.run`` on
#: its ``XJobCreate`` and returns its ``result_type``.
KINDS: dict[str, KindSpec] = {
    name: KindSpec(
        name=name,
        queue=t.queue,
        module=f"{__name__}.{name}",
        request_type=t,
        result_type=t.result_type,
    )
    for name, t in CREATE_TYPE_OF_KIND.items()
}


class UnknownKindError(LookupError):
    """The job names a kind this worker does not know."""


RunFunction = Callable[[Any, JobContext], "BaseModel | FanOut"]
"""A kind's ``run``: its create model (typed per kind) and the context → its result model or a
fan-out."""


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

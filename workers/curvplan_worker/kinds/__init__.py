"""Job kinds: ``kind name → run(request: dict, ctx: JobContext) -> dict``.

A kind module exposes ``run``. It is imported lazily, in the child process that runs
the attempt (and preloaded in the forkserver), never in the worker parent, so a kind
may import torch without the parent paying for it.

A kind reports progress with ``ctx.report_progress(fraction, stage, message)``; that
call raises :class:`curvplan_worker.errors.JobCancelled` once the job's cancellation was
requested, which is how cancel reaches a running job (cooperatively). A kind raises
:class:`curvplan_worker.errors.JobError` for a failure it diagnosed (bad input, …): the job
fails with that error and is not retried.

The context and the fan-out types live in :mod:`curvplan_worker.job_context`.

Fan-out: instead of a result dict a kind may return a ``FanOut`` (child jobs to
create). The job then waits for its children (``curvplan_core.jobs.fanout``) and is run
again once they have all ended, this time with ``ctx.children`` holding their outcomes:
that second run (the fan-in) returns the job's result.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from curvplan.types.jobs import QUEUE_OF_KIND
from curvplan_worker.job_context import FanOut, JobContext


@dataclass(frozen=True)
class KindSpec:
    """Where a kind's code lives and which queue its jobs go to."""

    name: str
    queue: str
    module: str


#: Derived from the contract's registry: kind ``x`` runs ``curvplan_worker.kinds.x.run``.
KINDS: dict[str, KindSpec] = {
    name: KindSpec(name=name, queue=queue, module=f"{__name__}.{name}")
    for name, queue in QUEUE_OF_KIND.items()
}


class UnknownKindError(LookupError):
    """The job names a kind this worker does not know."""


RunFunction = Callable[[dict[str, Any], JobContext], "dict[str, Any] | FanOut"]


def kind_spec(name: str) -> KindSpec:
    """The spec of kind ``name``; UnknownKindError if there is none."""
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownKindError(
            f"unknown job kind {name!r}; this worker runs {sorted(KINDS)}"
        ) from None


def load_run(name: str) -> RunFunction:
    """Import kind ``name`` and return its ``run`` function."""
    module = importlib.import_module(kind_spec(name).module)
    return module.run


def modules_for_queues(queues: Iterable[str]) -> list[str]:
    """The kind modules serving ``queues`` (what the forkserver preloads)."""
    wanted = set(queues)
    return [spec.module for spec in KINDS.values() if spec.queue in wanted]

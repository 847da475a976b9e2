"""An ``analyze`` job's cost before it is queued: admission and the fan-out (torch-free).

Registered in ``curvplan_server.jobs.submission``; runs after the analyze checks of
:mod:`.references`, in the transaction that inserts the job. From the model's config or spec,
the stored safetensors headers of its checkpoint and dataset, the options, the live gpu
worker slots and the service's settings, ``curvplan_core.analysis_plan`` estimates the
analysis and decides (docs/operations.md#fan-out-at-submission):

* ``too-large`` (the least memory it needs exceeds the workers' memory limit) and
  ``over-time-limit`` (an attempt's estimate exceeds its kind's time limit) are 422s naming
  ``body.options``, the estimate and the options that shrink it: nothing is queued;
* a fan-out is returned as the children to insert with the job, which then waits for them.

Where the API cannot know the parameters or the sample (a ``file://`` artifact no worker has
read yet), nothing is estimated here and the job runs in one process; ``fan_out: true`` is
then a 422, since the blocks cannot be named.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from curvplan.types.artifact_inputs import checkpoint_ids
from curvplan.types.jobs import AnalyzeJobCreate
from curvplan.types.options import AnalysisOptions
from curvplan.types.problems import FieldErrorEntry
from curvplan_core import analysis_plan
from curvplan_core.blocks import BlockError, UnknownBlocks
from curvplan_core.config import Settings
from curvplan_core.fanout_groups import live_workers
from curvplan_server.analyze.references import stored_headers
from curvplan_server.problems import validation_problem

GPU_QUEUE = "gpu"


@dataclass(frozen=True)
class SubmissionFanOut:
    """Children to insert with the job (their create models), and the fan-in's own
    estimated seconds."""

    children: list[analysis_plan.PlannedChild]
    fan_in_seconds: float
    reason: str


def _error(loc: tuple[str, ...], message: str, type_: str) -> FieldErrorEntry:
    full = ["body", *loc]
    return {"field": ".".join(full), "loc": full, "message": message, "type": type_}


def _stored_order(session: Any, options: AnalysisOptions) -> AnalysisOptions:
    """``options`` with ``block_definitions`` in the key order PostgreSQL's jsonb keeps, which
    is the order the worker reads the stored request in (and so the engine's block order)."""
    definitions = options.block_definitions
    if definitions is None or len(definitions) < 2:
        return options
    stored = session.execute(
        text("SELECT CAST(:v AS jsonb)"), {"v": json.dumps(definitions)}
    ).scalar_one()
    return options.model_copy(update={"block_definitions": stored})


def limits_from(settings: Settings, live: int) -> analysis_plan.Limits:
    return analysis_plan.Limits(
        live_workers=live,
        time_limits={kind: settings.job_time_limit(kind) for kind in ("analyze", "analyze_blocks")},
        memory_limit_bytes=settings.worker_memory_limit,
        fan_out_min_seconds=settings.fan_out_min_seconds,
        basis_budget=settings.worker_basis_budget,
    )


def admit_analysis(
    session: Any, project_id: uuid.UUID, body: AnalyzeJobCreate, settings: Settings
) -> SubmissionFanOut | None:
    """Refuse (422) an analysis that cannot fit or cannot finish in time; its fan-out, if it
    fans out (else None: one process). ``body`` is the validated create model the router
    parsed: its model and options are read as they are, never parsed again."""
    model = body.model
    options = _stored_order(session, body.options)
    checkpoint = checkpoint_ids(body.checkpoint)
    dataset = body.dataset
    headers = stored_headers(session, project_id, [dataset, *checkpoint])
    shapes = analysis_plan.parameter_shapes(model, [headers.get(i) for i in checkpoint])
    sample = analysis_plan.sample_size(model, headers.get(dataset))
    if shapes is None or sample is None:
        if options.fan_out:
            loc = ("checkpoint",) if shapes is None else ("dataset",)
            raise validation_problem(
                [
                    _error(
                        loc,
                        "fan_out is planned at submission from the artifact's stored "
                        "safetensors header, which this service does not know yet (a "
                        "file:// artifact no worker has read); submit with fan_out false "
                        "or unset",
                        "fan_out_unplannable",
                    )
                ]
            )
        return None
    live = live_workers(session.connection(), GPU_QUEUE, settings.worker_stale_seconds)
    try:
        plan = analysis_plan.plan_analysis(
            model, options, shapes, sample, limits_from(settings, live)
        )
    except UnknownBlocks as exc:
        problem = _error(("options", "off_diagonal"), str(exc), "unknown_block")
        raise validation_problem([problem]) from None
    except BlockError as exc:
        field = "block_definitions" if options.block_definitions else "blocks"
        problem = _error(("options", field), str(exc), "invalid_blocks")
        raise validation_problem([problem]) from None
    if plan.refusals:
        raise validation_problem(
            [_error(r.field, r.message, r.type) for r in plan.refusals],
            detail="; ".join(f"{r.type}: {r.message}" for r in plan.refusals),
        )
    if not plan.fans_out:
        return None
    return SubmissionFanOut(
        analysis_plan.child_requests(body, plan), plan.fan_in_seconds, plan.reason
    )

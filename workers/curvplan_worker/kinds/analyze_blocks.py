"""The ``analyze_blocks`` kind: one group of an analysis's block fan-out (torch; gpu queue).

Loads the parent's checkpoint and dataset with the parent's options and measures only the
blocks and off-diagonal pairs it was given (docs/numerics.md#block-fan-out); every block and
pair has its own generator, so the records equal a single-process run's.
"""

from __future__ import annotations

import curvplan_worker.curvature.analyze as curvature_analysis
from curvplan.types.jobs import AnalyzeBlocksJobCreate
from curvplan.types.results import AnalyzeBlocksResult
from curvplan_core.config import get_settings
from curvplan_worker.analyze.artifacts import attempt_access
from curvplan_worker.analyze.pipeline import measure_engine, resolve_checkpoint, worker_machine
from curvplan_worker.errors import JobError
from curvplan_worker.job_context import JobContext


def run(body: AnalyzeBlocksJobCreate, ctx: JobContext) -> AnalyzeBlocksResult:
    """Measure this group's blocks and pairs (the records its parent assembles)."""
    if not body.blocks and not body.pairs:
        raise JobError("invalid-request", "Nothing to measure", "blocks: give blocks or pairs")
    ctx.report_progress(0.0, "loading", "resolving artifacts")
    settings = get_settings()
    # Open until the engine has read the files: the cache keeps the resolved blobs pinned.
    with attempt_access(ctx) as (access, project_id):
        checkpoint = resolve_checkpoint(access, project_id, body.checkpoint, "checkpoint")
        dataset = access.resolve(project_id, str(body.dataset), "dataset", "dataset")
        share = curvature_analysis.BlockShare(
            blocks=tuple(body.blocks), pairs=tuple((r, c) for r, c in body.pairs)
        )
        measured = measure_engine(
            body.model,
            [str(c.path) for c in checkpoint],
            str(dataset.path),
            body.options,
            worker_machine(settings),
            ctx,
            devices=body.resources.devices,
            lease_seconds=settings.lease_seconds,
            only=share,
        )
    ctx.report_progress(1.0, "done", f"{len(body.blocks)} blocks, {len(body.pairs)} pairs")
    return AnalyzeBlocksResult(measurements=measured, estimated_cost=body.estimated_cost)

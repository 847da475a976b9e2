"""The ``sweep_point`` kind: one training run of a sweep (torch; gpu queue, CUDA if present).

Builds the model (a reference spec or a Hugging Face config, ``curvature.sources``), loads
the start checkpoint (or keeps the seeded initialisation), the training data and the
evaluation data, and runs :func:`curvplan_worker.sweep.train.train_point`.
"""

from __future__ import annotations

import uuid

import torch

from curvplan.types.jobs import SweepPointJobCreate
from curvplan.types.results import SweepPointJobResult
from curvplan.types.spec import SpecError
from curvplan_worker.analyze.artifacts import ArtifactAccess, attempt_access
from curvplan_worker.curvature.checkpoint import CheckpointError, CheckpointMismatch
from curvplan_worker.curvature.data import DataError
from curvplan_worker.curvature.hf import HFModelError
from curvplan_worker.curvature.sources import load_source
from curvplan_worker.errors import JobError
from curvplan_worker.job_context import JobContext
from curvplan_worker.sweep.moments import OptimizerMoments, read_moments
from curvplan_worker.sweep.train import train_point

#: Below this many parameters one thread is fastest and leaves the other cores to other runs.
SMALL_MODEL_PARAMETERS = 1_000_000


def run(body: SweepPointJobCreate, ctx: JobContext) -> SweepPointJobResult:
    """Train one point."""
    if body.runner != "builtin" or body.model is None:  # agent points wait in their own queue
        raise JobError(
            "invalid-request",
            "Invalid sweep point",
            "this point belongs to an agent sweep: a `curvplan agent` of its project trains it",
        )
    ctx.report_progress(0.0, "loading", "resolving artifacts")
    # Open until the attempt ends: the cache keeps the resolved blobs pinned while they are read.
    with attempt_access(ctx) as (access, project_id):
        return _train(body, access, project_id, ctx)


def _train(
    body: SweepPointJobCreate, access: ArtifactAccess, project_id: uuid.UUID, ctx: JobContext
) -> SweepPointJobResult:
    assert body.model is not None  # checked by run
    train_art = access.resolve(project_id, str(body.train_data), "dataset", "train_data")
    eval_art = access.resolve(project_id, str(body.eval_data), "dataset", "eval_data")
    ckpt = (
        access.resolve(project_id, str(body.checkpoint), "checkpoint", "checkpoint")
        if body.checkpoint is not None
        else None
    )
    try:
        source = load_source(
            body.model,
            str(ckpt.path) if ckpt is not None else None,
            str(train_art.path),
            seed=body.point.seed,
        )
        train = source.data
        evaluation = source.read_data(eval_art.path)
    except DataError as exc:
        raise JobError("invalid-dataset", "Dataset does not fit the model", str(exc)) from None
    except (CheckpointMismatch, CheckpointError) as exc:
        raise JobError(
            "invalid-checkpoint", "Checkpoint does not fit the model", str(exc)
        ) from None
    except (SpecError, HFModelError) as exc:
        raise JobError("invalid-model-spec", "The model is invalid", str(exc)) from None
    assert train is not None
    model = source.module
    moments: OptimizerMoments | None = None
    if body.optimizer_state is not None:
        state = access.resolve(
            project_id, str(body.optimizer_state), "checkpoint", "optimizer_state"
        )
        try:
            moments = read_moments(state.path, model)
        except (CheckpointMismatch, CheckpointError) as exc:
            raise JobError(
                "invalid-checkpoint",
                "The optimizer state does not fit the model",
                f"optimizer_state: {exc}",
            ) from None
    threads = torch.get_num_threads()
    if sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS:
        torch.set_num_threads(1)
    try:
        result = train_point(
            model,
            source.objective,
            train,
            evaluation,
            body.point,
            body.optimizer,
            report=lambda f, stage, msg: ctx.report_progress(0.02 + 0.97 * f, stage, msg),
            moments=moments,
        )
    except ValueError as exc:
        raise JobError("invalid-request", "Invalid sweep point", str(exc)) from None
    except FloatingPointError as exc:
        raise JobError("diverged", "The training run diverged", str(exc)) from None
    finally:
        torch.set_num_threads(threads)
    ctx.report_progress(1.0, "done", "point trained")
    return SweepPointJobResult(point=result)

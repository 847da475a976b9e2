"""The ``analyze`` kind's submission checks (registered in ``curvplan_server.jobs.submission``).

``POST /v1/jobs`` runs them after the body's schema validation and the artifact checks every
kind gets (each id an artifact of the caller's project with the right kind, else a 422
naming the field), in the same transaction as the insert. From the service's settings, the
artifacts' stored safetensors headers and the model alone (no torch):

- the devices asked for must not exceed the service's ``max_job_devices``;
- a Hugging Face model's parameter count (computed from its config) must not exceed the
  service's ``max_model_parameters``;
- the shards of a checkpoint must not hold the same tensor twice;
- every intermediate checkpoint must hold the tensors (names, shapes) of the checkpoint at w*;
- a reference-spec model takes an ``{inputs, targets}`` dataset (the Hugging Face layout
  ``input_ids``/``labels`` is for Hugging Face models); a model with learned positions
  (GPT-2) takes sequences no longer than its ``n_positions``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from curvplan.types.artifact_inputs import HF_DATASET_TENSORS, checkpoint_ids
from curvplan.types.huggingface import (
    GPT2Config,
    HuggingFaceModel,
    parameter_count,
    parse_hf_config,
)
from curvplan.types.jobs import AnalyzeJobCreate, SweepJobCreate
from curvplan.types.problems import FieldErrorEntry
from curvplan_core.artifacts.safetensors_format import TensorSummaryJson
from curvplan_server.artifacts.models import Artifact
from curvplan_server.problems import validation_problem

ARTIFACT = Artifact.__table__
Loc = tuple[str | int, ...]
#: An artifact's stored tensors: name → dtype and shape.
Header = dict[str, TensorSummaryJson]
#: Tensor name → shape.
Shapes = dict[str, list[int] | None]


def _checkpoint_fields(body: AnalyzeJobCreate) -> list[list[tuple[Loc, uuid.UUID]]]:
    """Each checkpoint of the body (main, then intermediates) as its shards' (loc, id)."""
    out = []
    refs: list[tuple[Loc, uuid.UUID | list[uuid.UUID]]] = [(("checkpoint",), body.checkpoint)]
    refs += [
        (("intermediate_checkpoints", i), ref)
        for i, ref in enumerate(body.intermediate_checkpoints)
    ]
    for loc, ref in refs:
        ids = checkpoint_ids(ref)
        if isinstance(ref, list):
            out.append([((*loc, j), shard) for j, shard in enumerate(ids)])
        else:
            out.append([(loc, ids[0])])
    return out


def _error(loc: Loc, message: str, type_: str) -> FieldErrorEntry:
    full: list[str | int] = ["body", *loc]
    return {"field": ".".join(map(str, full)), "loc": full, "message": message, "type": type_}


def check_job_devices(body: AnalyzeJobCreate, max_devices: int) -> None:
    """422 naming ``body.resources.devices`` above the operator's CURVPLAN_MAX_JOB_DEVICES."""
    devices = body.resources.devices
    if devices > max_devices:
        raise validation_problem(
            [
                _error(
                    ("resources", "devices"),
                    f"{devices} devices asked for, more than one job may use on this service "
                    f"({max_devices}; CURVPLAN_MAX_JOB_DEVICES)",
                    "too_many_devices",
                )
            ]
        )


def check_model_size(body: AnalyzeJobCreate | SweepJobCreate, max_parameters: int | None) -> None:
    """422 naming ``body.model.config`` (a Hugging Face model) or ``body.model`` (a reference
    spec) when the model has more parameters than ``CURVPLAN_MAX_MODEL_PARAMETERS``."""
    model = body.model
    if max_parameters is None or model is None:  # an agent sweep names no model
        return
    if isinstance(model, HuggingFaceModel):
        loc: Loc = ("model", "config")
        count, source = parameter_count(model.config), "its config"
    else:
        loc, count, source = ("model",), model.parameter_count(), "its spec"
    if count > max_parameters:
        raise validation_problem(
            [
                _error(
                    loc,
                    f"the model has {count:,} parameters (computed from {source}), more than "
                    f"this service analyses ({max_parameters:,}; CURVPLAN_MAX_MODEL_PARAMETERS)",
                    "model_too_large",
                )
            ]
        )


def stored_headers(
    session: Session, project_id: uuid.UUID, ids: list[uuid.UUID]
) -> dict[uuid.UUID, Header]:
    """Stored tensor summaries (name → dtype, shape) of blob artifacts; file:// ones have none
    until a worker reads them."""
    rows = session.execute(
        select(ARTIFACT.c.id, ARTIFACT.c.tensors).where(
            ARTIFACT.c.id.in_(ids), ARTIFACT.c.project_id == project_id
        )
    ).all()
    out: dict[uuid.UUID, Header] = {}
    for row in rows:
        tensors = (row.tensors or {}).get("tensors") if isinstance(row.tensors, dict) else None
        if isinstance(tensors, dict):
            out[row.id] = tensors
    return out


def check_artifact_contents(
    session: Session, project_id: uuid.UUID, body: AnalyzeJobCreate
) -> None:
    """422 for shards that repeat a tensor, and for a dataset layout the model cannot take."""
    checkpoints = _checkpoint_fields(body)
    dataset_id = body.dataset
    ids = [dataset_id] + [artifact_id for shards in checkpoints for _, artifact_id in shards]
    headers = stored_headers(session, project_id, ids)
    errors: list[FieldErrorEntry] = []
    for shards in checkpoints:
        owner: dict[str, Loc] = {}
        for loc, artifact_id in shards:
            for name in sorted(headers.get(artifact_id) or {}):
                if name in owner:
                    where = ".".join(map(str, ("body", *owner[name])))
                    errors.append(
                        _error(
                            loc,
                            f"tensor {name!r} is also in the shard at {where}: each tensor "
                            "must be in exactly one shard",
                            "duplicate_tensor",
                        )
                    )
                    break
                owner[name] = loc
    errors += _intermediates_match(checkpoints, headers)
    dataset = headers.get(dataset_id)
    hf_names = sorted(set(dataset or {}) & set(HF_DATASET_TENSORS))
    if not isinstance(body.model, HuggingFaceModel) and hf_names:
        errors.append(
            _error(
                ("dataset",),
                f"the dataset holds {', '.join(hf_names)} (the Hugging Face layout), which is "
                "for Hugging Face models; a reference model spec takes 'inputs' and 'targets'",
                "dataset_layout",
            )
        )
    if isinstance(body.model, HuggingFaceModel) and "input_ids" in (dataset or {}):
        config = parse_hf_config(body.model.config)
        shape = (dataset or {})["input_ids"].get("shape") or []
        if isinstance(config, GPT2Config) and len(shape) == 2 and shape[1] > config.n_positions:
            errors.append(
                _error(
                    ("dataset",),
                    f"input_ids has sequences of {shape[1]} tokens, longer than the model's "
                    f"n_positions ({config.n_positions}): GPT-2's learned positions end there",
                    "sequence_too_long",
                )
            )
    if errors:
        raise validation_problem(errors)


def _shapes(shards: list[tuple[Loc, uuid.UUID]], headers: dict[uuid.UUID, Header]) -> Shapes | None:
    """Tensor name → shape over a checkpoint's shards; None when a shard has no stored header
    (a file:// artifact: the worker checks it)."""
    shapes: Shapes = {}
    for _, artifact_id in shards:
        tensors = headers.get(artifact_id)
        if tensors is None:
            return None
        shapes.update({name: t.get("shape") for name, t in tensors.items()})
    return shapes


def tensor_difference(wanted: Shapes, shapes: Shapes) -> str | None:
    """``missing a, b; extra c; other shape d`` between two name → shape maps; None if equal."""
    if shapes == wanted:
        return None
    missing = sorted(set(wanted) - set(shapes))
    extra = sorted(set(shapes) - set(wanted))
    reshaped = sorted(n for n in set(wanted) & set(shapes) if wanted[n] != shapes[n])
    parts = [
        f"{label} {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
        for label, names in (("missing", missing), ("extra", extra), ("other shape", reshaped))
        if names
    ]
    return "; ".join(parts)


def _intermediates_match(
    checkpoints: list[list[tuple[Loc, uuid.UUID]]], headers: dict[uuid.UUID, Header]
) -> list[FieldErrorEntry]:
    """An intermediate checkpoint must hold the tensors (names and shapes) of the checkpoint
    at w*: both are saves of the model the request names (e.g. the checkpoint-* folders of
    one Trainer run), not of another architecture or size."""
    reference = _shapes(checkpoints[0], headers)
    if reference is None:
        return []
    errors: list[FieldErrorEntry] = []
    for i, shards in enumerate(checkpoints[1:]):
        shapes = _shapes(shards, headers)
        difference = None if shapes is None else tensor_difference(reference, shapes)
        if difference is not None:
            errors.append(
                _error(
                    ("intermediate_checkpoints", i),
                    f"the checkpoint does not hold the tensors of body.checkpoint (w*): "
                    f"{difference}; intermediate checkpoints are earlier saves of the same model",
                    "checkpoint_mismatch",
                )
            )
    return errors


#: The tensors of a branch sweep's optimizer state: AdamW's two moments of every parameter.
MOMENT_PREFIXES = ("exp_avg", "exp_avg_sq")


def check_optimizer_states(
    session: Session,
    project_id: uuid.UUID,
    checkpoints: Sequence[uuid.UUID],
    states: Sequence[uuid.UUID | None],
) -> None:
    """422 for a branch sweep's ``optimizer_states`` that do not hold AdamW's moments of its
    checkpoints' tensors: ``exp_avg.<name>`` and ``exp_avg_sq.<name>`` with the shape of every
    tensor of ``checkpoints[0]``, nothing else (docs/budget.md#branch-sweep)."""
    given = [(i, s) for i, s in enumerate(states) if s is not None]
    if not given or not checkpoints:
        return
    headers = stored_headers(session, project_id, [checkpoints[0], *(s for _, s in given)])
    reference = headers.get(checkpoints[0])
    if reference is None:
        return  # a file:// checkpoint has no stored header; the worker checks them
    wanted: Shapes = {
        f"{kind}.{name}": t.get("shape")
        for name, t in reference.items()
        for kind in MOMENT_PREFIXES
    }
    errors: list[FieldErrorEntry] = []
    for i, state in given:
        tensors = headers.get(state)
        if tensors is None:
            continue
        shapes: Shapes = {name: t.get("shape") for name, t in tensors.items()}
        difference = tensor_difference(wanted, shapes)
        if difference is None:
            continue
        errors.append(
            _error(
                ("optimizer_states", i),
                "the optimizer state does not hold AdamW's moments (exp_avg.<tensor>, "
                f"exp_avg_sq.<tensor>) of body.checkpoints.0's tensors ({difference})",
                "optimizer_state_mismatch",
            )
        )
    if errors:
        raise validation_problem(errors)


def check_branch_checkpoints(
    session: Session, project_id: uuid.UUID, checkpoints: Sequence[uuid.UUID]
) -> None:
    """422 for a branch sweep's ``checkpoints`` that repeat one, or that are not saves of one
    model: every checkpoint must hold the tensors (names and shapes) of the first."""
    ids = list(checkpoints)
    if not ids:
        return
    headers = stored_headers(session, project_id, ids)
    errors: list[FieldErrorEntry] = []
    first_at: dict[uuid.UUID, int] = {}
    reference = headers.get(ids[0])
    for i, artifact_id in enumerate(ids):
        loc: Loc = ("checkpoints", i)
        if artifact_id in first_at:
            errors.append(
                _error(
                    loc,
                    f"artifact {artifact_id} is already body.checkpoints.{first_at[artifact_id]}: "
                    "give each checkpoint once",
                    "duplicate_checkpoint",
                )
            )
            continue
        first_at[artifact_id] = i
        tensors = headers.get(artifact_id)
        if i == 0 or reference is None or tensors is None:
            continue  # file:// artifacts have no stored header; the worker checks them
        shapes: Shapes = {name: t.get("shape") for name, t in tensors.items()}
        wanted: Shapes = {name: t.get("shape") for name, t in reference.items()}
        difference = tensor_difference(wanted, shapes)
        if difference is not None:
            errors.append(
                _error(
                    loc,
                    f"the checkpoint does not hold the tensors of body.checkpoints.0 "
                    f"({difference}): a branch sweep branches from saves of one model",
                    "checkpoint_mismatch",
                )
            )
    if errors:
        raise validation_problem(errors)

"""The ``analyze`` kind's submission checks (registered in ``curvplan_server.jobs.submission``).

``POST /v1/jobs`` runs them after the body's schema validation and the artifact checks every
kind gets (each id an artifact of the caller's project with the right kind, else a 422
naming the field), in the same transaction as the insert. From the service's settings, the
artifacts' stored safetensors headers and the model alone (no torch):

- the devices asked for must not exceed the service's ``max_job_devices``;
- a Hugging Face model's parameter count (computed from its config) must not exceed the
  service's ``max_model_parameters``;
- the shards of a checkpoint must not hold the same tensor twice;
- a reference-spec model takes an ``{inputs, targets}`` dataset (the Hugging Face layout
  ``input_ids``/``labels`` is for Hugging Face models); a model with learned positions
  (GPT-2) takes sequences no longer than its ``n_positions``.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from curvplan.types.artifact_inputs import HF_DATASET_TENSORS, checkpoint_ids
from curvplan.types.huggingface import GPT2Config, parameter_count, parse_hf_config
from curvplan.types.spec import ModelSpec
from curvplan_server.artifacts.models import Artifact
from curvplan_server.problems import validation_problem

ARTIFACT = Artifact.__table__
Loc = tuple[str | int, ...]


def _checkpoint_fields(body: dict[str, Any]) -> list[list[tuple[Loc, uuid.UUID]]]:
    """Each checkpoint of the body (main, then intermediates) as its shards' (loc, id)."""
    out = []
    refs: list[tuple[Loc, Any]] = [(("checkpoint",), body["checkpoint"])]
    refs += [
        (("intermediate_checkpoints", i), ref)
        for i, ref in enumerate(body.get("intermediate_checkpoints") or [])
    ]
    for loc, ref in refs:
        ids = checkpoint_ids(ref)
        if isinstance(ref, list):
            out.append([((*loc, j), shard) for j, shard in enumerate(ids)])
        else:
            out.append([(loc, ids[0])])
    return out


def _error(loc: Loc, message: str, type_: str) -> dict[str, Any]:
    full: list[str | int] = ["body", *loc]
    return {"field": ".".join(map(str, full)), "loc": full, "message": message, "type": type_}


def check_job_devices(body: dict[str, Any], max_devices: int) -> None:
    """422 naming ``body.resources.devices`` above the operator's CURVPLAN_MAX_JOB_DEVICES."""
    devices = int((body.get("resources") or {}).get("devices", 1))
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


def check_model_size(body: dict[str, Any], max_parameters: int | None) -> None:
    """422 naming ``body.model.config`` (a Hugging Face model) or ``body.model`` (a reference
    spec) when the model has more parameters than ``CURVPLAN_MAX_MODEL_PARAMETERS``."""
    model = body["model"]
    if max_parameters is None:
        return
    if model.get("source") == "huggingface":
        loc: Loc = ("model", "config")
        count, source = parameter_count(model["config"]), "its config"
    else:
        spec = ModelSpec.model_validate({k: v for k, v in model.items() if k != "source"})
        loc, count, source = ("model",), spec.parameter_count(), "its spec"
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
) -> dict[uuid.UUID, dict[str, Any]]:
    """Stored tensor summaries (name → dtype, shape) of blob artifacts; file:// ones have none
    until a worker reads them."""
    rows = session.execute(
        select(ARTIFACT.c.id, ARTIFACT.c.tensors).where(
            ARTIFACT.c.id.in_(ids), ARTIFACT.c.project_id == project_id
        )
    ).all()
    out = {}
    for row in rows:
        tensors = (row.tensors or {}).get("tensors") if isinstance(row.tensors, dict) else None
        if isinstance(tensors, dict):
            out[row.id] = tensors
    return out


def check_artifact_contents(session: Session, project_id: uuid.UUID, body: dict[str, Any]) -> None:
    """422 for shards that repeat a tensor, and for a dataset layout the model cannot take."""
    checkpoints = _checkpoint_fields(body)
    dataset_id = uuid.UUID(body["dataset"])
    ids = [dataset_id] + [artifact_id for shards in checkpoints for _, artifact_id in shards]
    headers = stored_headers(session, project_id, ids)
    errors = []
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
    dataset = headers.get(dataset_id)
    hf_names = sorted(set(dataset or {}) & set(HF_DATASET_TENSORS))
    if body["model"].get("source") != "huggingface" and hf_names:
        errors.append(
            _error(
                ("dataset",),
                f"the dataset holds {', '.join(hf_names)} (the Hugging Face layout), which is "
                "for Hugging Face models; a reference model spec takes 'inputs' and 'targets'",
                "dataset_layout",
            )
        )
    if body["model"].get("source") == "huggingface" and "input_ids" in (dataset or {}):
        config = parse_hf_config(body["model"]["config"])
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

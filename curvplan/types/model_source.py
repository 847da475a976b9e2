"""Where an analyze job's model comes from: the reference spec or a Hugging Face config.

``model`` is either today's :class:`~curvplan.types.spec.ModelSpec` (no ``source`` key) or
``{"source": "huggingface", "config": {…config.json…}}``
(:class:`~curvplan.types.huggingface.HuggingFaceModel`). The choice is made on the ``source``
key alone, so a validation error names the field of the chosen form
(``model.d_model``, ``model.config.model_type``), never a union member.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import JsonValue, PlainSerializer, PlainValidator

from curvplan.types.huggingface import HuggingFaceModel
from curvplan.types.spec import ModelSpec

MODEL_SOURCES = ("reference", "huggingface")


def _model_source(value: Any) -> ModelSpec | HuggingFaceModel:
    if isinstance(value, ModelSpec | HuggingFaceModel):
        return value
    if isinstance(value, dict) and "source" in value:
        source = value["source"]
        if source == "reference":
            return ModelSpec.model_validate({k: v for k, v in value.items() if k != "source"})
        if source != "huggingface":
            raise ValueError(
                f"source {source!r} is not a model source; use 'huggingface' with a config, "
                "or give the reference spec without a source"
            )
        return HuggingFaceModel.model_validate(value)
    return ModelSpec.model_validate(value)


def _dump(value: ModelSpec | HuggingFaceModel) -> ModelSpec | HuggingFaceModel:
    """The model as it is: serialized by its own model's schema (``return_type``), with the
    caller's mode, exclude_unset and exclude_none."""
    return value


ModelSource = Annotated[
    ModelSpec | HuggingFaceModel,
    PlainValidator(_model_source, json_schema_input_type=ModelSpec | HuggingFaceModel),
    PlainSerializer(_dump, return_type=ModelSpec | HuggingFaceModel),
]
"""The ``model`` field of an analyze request."""


def model_source_name(model: ModelSpec | HuggingFaceModel) -> str:
    """``reference`` or ``huggingface``."""
    return "huggingface" if isinstance(model, HuggingFaceModel) else "reference"


def describe_model(request: Any, measurements: Any = None) -> str | None:
    """One line on what an analyze job measures: the architecture (or the reference spec's
    sizes), the parameter count, the checkpoint's shards, and a precision limit the engine met.

    ``request`` is the job's stored request, ``measurements`` its ``result.measurements``
    (absent until it succeeded); None for jobs without a model.
    """
    if not isinstance(request, dict) or not isinstance(request.get("model"), dict):
        return None
    model = request["model"]
    measured = measurements if isinstance(measurements, dict) else {}
    engine_model: dict[str, JsonValue] = (
        measured["model"] if isinstance(measured.get("model"), dict) else {}
    )
    if model.get("source") == "huggingface":
        config: dict[str, JsonValue] = (
            model["config"] if isinstance(model.get("config"), dict) else {}
        )
        text = f"Hugging Face {config.get('model_type')}"
        declared = config.get("architectures")
        architecture = engine_model.get("architecture") or (
            declared[0] if isinstance(declared, list) and declared else None
        )
        if architecture:
            text += f" ({architecture})"
    else:
        text = (
            f"reference Transformer: {model.get('n_layers')} layers, d_model "
            f"{model.get('d_model')}, {model.get('n_heads')} heads"
        )
    n_parameters = measured.get("n_parameters")
    if isinstance(n_parameters, int):
        text += f" · {n_parameters:,} parameters"
    checkpoint = request.get("checkpoint")
    if isinstance(checkpoint, list):
        text += f" · checkpoint in {len(checkpoint)} shards"
    limited = engine_model.get("precision_limited")
    if isinstance(limited, dict) and limited.get("limited"):
        text += f" · precision limited: {limited.get('reason')}"
    return text

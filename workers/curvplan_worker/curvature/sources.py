"""Model sources of an analysis: the reference Transformer of a ``ModelSpec``, or a Hugging
Face causal LM built from its ``config.json`` (``{"source": "huggingface", "config": {...}}``).

:func:`load_source` turns either into what the curvature operator needs — a module whose
``forward(inputs)`` gives the outputs, the objective, the evaluation sample and the default
blocks — plus what the result reports about the model (its description, the precision limit,
and whether the paper's bounds apply). See ``docs/engine-model-sources.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict

import torch
from torch import nn

from curvplan.types.huggingface import HuggingFaceModel
from curvplan.types.spec import ModelSpec, parse_spec
from curvplan_worker.curvature.checkpoint import check_state, load_checkpoint
from curvplan_worker.curvature.data import Dataset, load_dataset, validate_dataset
from curvplan_worker.curvature.objective import CausalLMObjective, Objective, objective_for

if TYPE_CHECKING:
    from pydantic import JsonValue

    from curvplan_worker.curvature.hf import HFModel, PrecisionLimit

HF_SOURCE: Final = "huggingface"

ModelInput = ModelSpec | HuggingFaceModel | Mapping[str, Any]
"""What the engine's JSON-facing entry points (``analyze``, ``plan_blocks``) take: the
contract's typed model source (a job's, used as it is) or its JSON form (a spec file, a
script), which :func:`parse_model` turns into the typed one once, at that entry."""

TypedModel = ModelSpec | HuggingFaceModel
"""The model source every engine stage takes: parsed, never reopened."""

CheckpointPaths = str | Path | Sequence[str | Path] | None
"""A checkpoint: one safetensors file, a list of shards, or none (the built weights)."""


class HFModelJson(TypedDict):
    """A Hugging Face model source in its JSON form, as :func:`read_model_dir` reads it."""

    source: Literal["huggingface"]
    config: dict[str, JsonValue]


NOT_IN_THEORY_FAMILY = (
    "the paper's bounds (Petrov et al. 2025) are derived for the reference Transformer family "
    "(single-head or multi-head softmax attention with separate Q/K/V, LayerNorm, ReLU/GELU "
    "FFN); a {arch} is outside it, so its blocks get no theoretical bound"
)

LOGIT_BUDGET = 2**26
"""Default micro-batch: at most this many logits (tokens × vocabulary) per batch, so that the
cross-entropy's double backward stays within a few GiB at a 50k vocabulary."""


def is_hf_source(model: Any) -> bool:
    """True for ``{"source": "huggingface", ...}`` (dict or contract model)."""
    if isinstance(model, Mapping):
        return model.get("source") == HF_SOURCE
    return getattr(model, "source", None) == HF_SOURCE


def parse_model(model: ModelInput) -> TypedModel:
    """The typed model source of ``model`` (a typed one as it is; a JSON form validated once):
    ``SpecError`` or ``HFModelError`` naming the field."""
    if isinstance(model, ModelSpec | HuggingFaceModel):
        return model
    if is_hf_source(model):
        from pydantic import ValidationError

        try:
            return HuggingFaceModel.model_validate(dict(model))
        except ValidationError as exc:
            from curvplan_worker.curvature.hf import HFModelError

            raise HFModelError(
                "; ".join(
                    f"model.{'.'.join(str(x) for x in error['loc'])}: {error['msg']}"
                    for error in exc.errors()
                )
            ) from None
    return parse_spec(dict(model))


class ReferenceDescription(TypedDict):
    """What was built from a reference spec (the result's ``model``): the spec as parsed."""

    source: Literal["reference"]
    spec: dict[str, JsonValue]


class HFDescription(TypedDict):
    """What was built from a Hugging Face config (the result's ``model``)."""

    source: Literal["huggingface"]
    model_type: str
    architecture: str
    tied_embeddings: bool
    vocab_size: int
    precision_limited: PrecisionLimit


REFERENCE_PRECISION: PrecisionLimit = {
    "limited": False,
    "reason": None,
    "reachable_relative_accuracy": None,
}
"""The reference Transformer computes every part in the run's dtype."""


@dataclass
class ModelSource:
    """A built model at its checkpoint weights and the evaluation sample it is measured on."""

    kind: str  # "reference" | "huggingface"
    module: nn.Module
    objective: Objective
    data: Dataset | None
    default_blocks: dict[str, list[str]] | None
    description: ReferenceDescription | HFDescription
    spec: ModelSpec | None = None
    precision: PrecisionLimit = field(default_factory=lambda: REFERENCE_PRECISION.copy())
    bounds_reason: str | None = None  # None: the model is in the theory's family
    vocab_size: int | None = None
    hf_model: HFModel | None = None  # the built Hugging Face model of a huggingface source

    def read_data(self, path: str | Path) -> Dataset:
        """Another dataset of this model (e.g. a sweep's training or held-out data), read and
        checked like ``data``; ``DataError`` naming the tensor."""
        if self.spec is not None:
            return load_dataset(self.spec, path)
        from curvplan_worker.curvature import hf
        from curvplan_worker.curvature.checkpoint import read_safetensors

        inputs, targets = hf.validate_hf_data(self.hf_model, read_safetensors(path, "data"))
        return Dataset(inputs, targets)

    def micro_batch(self, requested: int | None) -> int | None:
        """The evaluation micro-batch: the requested size, else (causal LMs with a large
        vocabulary) as many sequences as fit :data:`LOGIT_BUDGET` logits, else everything."""
        if requested:
            return int(requested)
        if self.data is None or self.vocab_size is None or self.data.targets.dim() < 2:
            return None
        tokens = int(self.data.targets.shape[-1])
        per_sequence = max(1, tokens * self.vocab_size)
        fit = max(1, LOGIT_BUDGET // per_sequence)
        return None if fit >= len(self.data) else fit


def load_source(
    model: TypedModel,
    checkpoint: CheckpointPaths,
    data_path: str | Path | None,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    built: nn.Module | None = None,
    data: Dataset | None = None,
) -> ModelSource:
    """Build (or take ``built``) the model of ``model``, load ``checkpoint`` (one safetensors
    file or a list of shards), read and validate the dataset. Raises the engine's
    ``ValueError`` subclasses naming the field (``SpecError``, ``HFModelError``,
    ``CheckpointMismatch``, ``CheckpointError``, ``DataError``)."""
    if isinstance(model, HuggingFaceModel):
        return _load_hf(model, checkpoint, data_path, dtype, seed, built, data)
    return _load_reference(model, checkpoint, data_path, dtype, seed, built, data)


def _load_reference(
    spec: ModelSpec,
    checkpoint: CheckpointPaths,
    data_path: str | Path | None,
    dtype: torch.dtype,
    seed: int,
    built: nn.Module | None,
    data: Dataset | None,
) -> ModelSource:
    from curvplan_worker.curvature.model import build_model

    module = built
    if module is None:
        module = build_model(spec, dtype=dtype, seed=seed)
        if checkpoint is not None:
            paths = [checkpoint] if isinstance(checkpoint, str | Path) else list(checkpoint)
            if len(paths) == 1:
                load_checkpoint(module, paths[0])
            else:
                from curvplan_worker.curvature.hf import read_shards

                state = read_shards(paths)
                label = f"{len(paths)} shards"
                check_state(module, state, label)
                with torch.no_grad():
                    for name, param in module.named_parameters():
                        param.copy_(state[name].to(param.dtype))
    if data is None:
        if data_path is None:
            raise ValueError("data: give a data file (safetensors with inputs and targets)")
        data = load_dataset(spec, data_path)
    else:
        data = validate_dataset(spec, data)
    task = spec.task
    return ModelSource(
        kind="reference",
        module=module,
        objective=objective_for(spec),
        data=data,
        default_blocks=None,
        description={"source": "reference", "spec": spec.model_dump()},
        spec=spec,
        precision=REFERENCE_PRECISION.copy(),
        bounds_reason=None,
        vocab_size=getattr(task, "vocab_size", None) if task.type == "causal_lm" else None,
    )


def _load_hf(
    model: HuggingFaceModel,
    checkpoint: CheckpointPaths,
    data_path: str | Path | None,
    dtype: torch.dtype,
    seed: int,
    built: nn.Module | None,
    data: Dataset | None,
) -> ModelSource:
    from curvplan_worker.curvature import hf
    from curvplan_worker.curvature.checkpoint import read_safetensors

    config = dict(model.config)
    source = hf.build_hf_model(config, dtype=dtype, seed=seed)
    if built is not None:
        source.module = built
    elif checkpoint is not None:
        shards = [checkpoint] if isinstance(checkpoint, str | Path) else list(checkpoint)
        hf.load_hf_weights(source, shards)
    if data is None:
        if data_path is None:
            raise ValueError(
                "data: give a data file (safetensors with input_ids[, attention_mask][, labels])"
            )
        tensors = read_safetensors(data_path, "data")
        inputs, targets = hf.validate_hf_data(source, tensors)
    else:
        inputs, targets = hf.validate_hf_data(
            source, {"inputs": data.inputs, "targets": data.targets}
        )
    return ModelSource(
        kind=HF_SOURCE,
        module=source.module,
        objective=CausalLMObjective(),
        data=Dataset(inputs, targets),
        default_blocks=hf.uniform_blocks(source.module, source.model_type),
        description={
            "source": HF_SOURCE,
            "model_type": source.model_type,
            "architecture": source.architecture,
            "tied_embeddings": source.tied_embeddings,
            "vocab_size": source.vocab_size,
            "precision_limited": source.precision_limited(dtype),
        },
        precision=source.precision_limited(dtype),
        bounds_reason=NOT_IN_THEORY_FAMILY.format(arch=source.architecture),
        vocab_size=source.vocab_size,
        hf_model=source,
    )


def read_model_dir(directory: str | Path) -> tuple[HFModelJson, list[str]]:
    """A ``save_pretrained`` directory → (``{"source": "huggingface", "config": …}``, shard
    paths). Shards come from ``model.safetensors.index.json`` when present, else
    ``model.safetensors``."""
    import json

    root = Path(directory)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise ValueError(f"--model {root}: no config.json (expected a save_pretrained directory)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--model {config_path}: {exc}") from None
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"--model {index}: not a safetensors index ({exc})") from None
        shards = [str(root / name) for name in dict.fromkeys(weight_map.values())]
    elif (root / "model.safetensors").is_file():
        shards = [str(root / "model.safetensors")]
    else:
        raise ValueError(f"--model {root}: no model.safetensors or model.safetensors.index.json")
    return {"source": HF_SOURCE, "config": config}, shards

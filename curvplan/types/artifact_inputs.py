"""How an analyze request refers to its weights and data (contract; torch-free).

- ``checkpoint``: one checkpoint artifact id, or a list of ids, one per shard of a sharded
  ``save_pretrained`` checkpoint (``model-00001-of-00003.safetensors``, …). The shards
  together hold every tensor once; which file holds which tensor does not matter (the
  ``model.safetensors.index.json`` stays on the client, which uploads every shard it names).
- ``dataset``: one dataset artifact in one of two layouts (:func:`dataset_layout`):

  * ``reference``: ``inputs`` and ``targets`` (the engine's own convention), and optionally
    ``groups``: int64 of shape ``(n,)``, one group id per example (e.g. its document), which
    makes the planner's loss-accuracy variance cluster-robust;
  * ``huggingface``: ``input_ids`` ``(n, seq)`` and optionally ``attention_mask`` and
    ``labels`` of the same shape, as a ``transformers`` causal LM takes them: labels are
    *not* shifted (the loss shifts them), ``-100`` is ignored; without labels the targets are
    ``input_ids[:, 1:]`` masked where ``attention_mask == 0``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, PlainSerializer, PlainValidator, TypeAdapter

MAX_CHECKPOINT_SHARDS = 256
"""More shards than this is not a checkpoint anyone uploads one by one."""

IGNORE_INDEX = -100
"""Label value without a loss term (``transformers``' and PyTorch's cross-entropy default)."""

REFERENCE_DATASET_TENSORS = ("inputs", "targets")
REFERENCE_DATASET_OPTIONAL = ("groups",)
HF_DATASET_REQUIRED = ("input_ids",)
HF_DATASET_OPTIONAL = ("attention_mask", "labels")
HF_DATASET_TENSORS = HF_DATASET_REQUIRED + HF_DATASET_OPTIONAL

DatasetLayout = Literal["reference", "huggingface"]


class DatasetLayoutError(ValueError):
    """The tensor names fit neither layout; ``tensor`` names the offending one."""

    def __init__(self, reason: str, tensor: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.tensor = tensor


def dataset_layout(names: Iterable[str]) -> DatasetLayout:
    """Which layout a dataset with these tensor names uses; :class:`DatasetLayoutError` if none.

    The layouts do not mix: ``inputs`` with ``attention_mask`` is refused, naming the tensor.
    """
    present = set(names)
    reference = present & set(REFERENCE_DATASET_TENSORS)
    hf = present & set(HF_DATASET_TENSORS)
    expected = (
        "a dataset holds 'inputs' and 'targets', or 'input_ids' with optional "
        "'attention_mask' and 'labels'"
    )
    if reference and hf:
        tensor = sorted(hf)[0]
        raise DatasetLayoutError(f"{expected}; the two layouts do not mix", tensor)
    if reference:
        for required in REFERENCE_DATASET_TENSORS:
            if required not in present:
                raise DatasetLayoutError(f"{expected}; found {sorted(present)}", required)
        allowed = set(REFERENCE_DATASET_TENSORS) | set(REFERENCE_DATASET_OPTIONAL)
        for extra in sorted(present - allowed):
            raise DatasetLayoutError(
                f"{expected} (and optionally 'groups'); unexpected tensor", extra
            )
        return "reference"
    if "input_ids" not in present:
        raise DatasetLayoutError(f"{expected}; found {sorted(present)}", "input_ids")
    for extra in sorted(present - set(HF_DATASET_TENSORS)):
        raise DatasetLayoutError(f"{expected}; unexpected tensor", extra)
    return "huggingface"


def _distinct(ids: list[uuid.UUID]) -> list[uuid.UUID]:
    seen: set[uuid.UUID] = set()
    for artifact_id in ids:
        if artifact_id in seen:
            raise ValueError(f"shard {artifact_id} is listed twice")
        seen.add(artifact_id)
    return ids


ShardList = Annotated[
    list[uuid.UUID],
    Field(min_length=1, max_length=MAX_CHECKPOINT_SHARDS),
    AfterValidator(_distinct),
]
_SHARDS: TypeAdapter[list[uuid.UUID]] = TypeAdapter(ShardList)
_ONE: TypeAdapter[uuid.UUID] = TypeAdapter(uuid.UUID)


def _checkpoint_ref(value: object) -> uuid.UUID | list[uuid.UUID]:
    # One form or the other by the JSON type, so an error names the field, not a union member.
    if isinstance(value, list | tuple):
        return _SHARDS.validate_python(list(value))
    return _ONE.validate_python(value)


def _dump_ref(value: uuid.UUID | list[uuid.UUID]) -> str | list[str]:
    return [str(v) for v in value] if isinstance(value, list) else str(value)


CheckpointRef = Annotated[
    uuid.UUID | list[uuid.UUID],
    PlainValidator(
        _checkpoint_ref,
        json_schema_input_type=uuid.UUID
        | Annotated[list[uuid.UUID], Field(min_length=1, max_length=MAX_CHECKPOINT_SHARDS)],
    ),
    PlainSerializer(_dump_ref, return_type=str | list[str]),
]
"""One checkpoint artifact id, or the ids of its shards (distinct, at least one)."""


def checkpoint_ids(ref: uuid.UUID | str | list[uuid.UUID] | list[str]) -> list[uuid.UUID]:
    """The shard ids of a checkpoint reference (one id → a one-element list)."""
    items = ref if isinstance(ref, list) else [ref]
    return [item if isinstance(item, uuid.UUID) else uuid.UUID(str(item)) for item in items]

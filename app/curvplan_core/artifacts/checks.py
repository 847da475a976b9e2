"""What each artifact kind must hold, checked from the validated safetensors header alone.

These checks need no torch and no data: they run on upload (and on ``file://`` artifacts
when a job starts). Checks against a model spec (names, shapes, token ranges) happen in
the worker, with the engine's own loaders.
"""

from __future__ import annotations

from curvplan.types.artifact_inputs import (
    HF_DATASET_OPTIONAL,
    REFERENCE_DATASET_TENSORS,
    DatasetLayoutError,
    dataset_layout,
)
from curvplan_core.artifacts.safetensors_format import SafetensorsInfo, TensorInfo

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
INT_DTYPES = frozenset({"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"})
DATASET_TENSORS = REFERENCE_DATASET_TENSORS
GROUP_DTYPES = frozenset({"I32", "I64"})
BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".inv_freq", "position_ids")
"""Non-parameter tensors that older ``transformers`` checkpoints carry (GPT-2's causal mask,
rotary frequencies, position ids) and that ``from_pretrained`` ignores: any dtype is fine."""


class ArtifactContentError(ValueError):
    """A well-formed safetensors file that is not a usable artifact of its kind."""

    def __init__(self, reason: str, tensor: str | None = None) -> None:
        super().__init__(reason if tensor is None else f"tensor {tensor!r}: {reason}")
        self.reason = reason
        self.tensor = tensor


def check_checkpoint(info: SafetensorsInfo) -> None:
    """A checkpoint (or one shard of one) holds at least one tensor and only floating-point
    parameters (known buffers, :data:`BUFFER_SUFFIXES`, may have any dtype)."""
    if not info.tensors:
        raise ArtifactContentError("a checkpoint must hold at least one tensor")
    for name, tensor in sorted(info.tensors.items()):
        if tensor.dtype not in FLOAT_DTYPES and not name.endswith(BUFFER_SUFFIXES):
            raise ArtifactContentError(
                f"checkpoint parameters must be floating point ({', '.join(sorted(FLOAT_DTYPES))})"
                f", found {tensor.dtype}",
                name,
            )


def check_dataset(info: SafetensorsInfo) -> None:
    """A dataset in one of the two layouts (``curvplan.types.artifact_inputs``).

    ``{inputs, targets}``: numeric, the same number of examples. ``{input_ids[,
    attention_mask][, labels]}``: integer token ids ``(n, seq)`` with ``seq ≥ 2`` (a causal
    LM predicts from the second token on), the mask (integer or bool) and labels (integer)
    of exactly that shape.
    """
    try:
        layout = dataset_layout(info.tensors)
    except DatasetLayoutError as exc:
        raise ArtifactContentError(exc.reason, exc.tensor) from None
    if layout == "reference":
        _check_reference_dataset(info.tensors)
    else:
        _check_hf_dataset(info.tensors)


def _check_reference_dataset(tensors: dict[str, TensorInfo]) -> None:
    for name in DATASET_TENSORS:
        tensor = tensors[name]
        if tensor.dtype not in FLOAT_DTYPES | INT_DTYPES:
            raise ArtifactContentError(f"dtype {tensor.dtype} is neither integer nor float", name)
        if not tensor.shape or tensor.shape[0] == 0:
            raise ArtifactContentError(
                f"needs a first dimension of examples (≥ 1), found shape {list(tensor.shape)}",
                name,
            )
    n_inputs = tensors["inputs"].shape[0]
    n_targets = tensors["targets"].shape[0]
    if n_inputs != n_targets:
        raise ArtifactContentError(f"{n_targets} examples but 'inputs' has {n_inputs}", "targets")
    groups = tensors.get("groups")
    if groups is not None:
        if groups.dtype not in GROUP_DTYPES:
            raise ArtifactContentError(
                f"group ids must be int64 (or int32), found {groups.dtype}", "groups"
            )
        if list(groups.shape) != [n_inputs]:
            raise ArtifactContentError(
                f"needs shape [{n_inputs}] (one group id per example), found {list(groups.shape)}",
                "groups",
            )


def _check_hf_dataset(tensors: dict[str, TensorInfo]) -> None:
    ids = tensors["input_ids"]
    if ids.dtype not in INT_DTYPES:
        raise ArtifactContentError(f"token ids must be integers, found {ids.dtype}", "input_ids")
    if len(ids.shape) != 2 or ids.shape[0] == 0 or ids.shape[1] < 2:
        raise ArtifactContentError(
            "needs shape (examples ≥ 1, sequence length ≥ 2), found " + str(list(ids.shape)),
            "input_ids",
        )
    allowed = {"attention_mask": INT_DTYPES | {"BOOL"}, "labels": INT_DTYPES}
    for name in HF_DATASET_OPTIONAL:
        tensor = tensors.get(name)
        if tensor is None:
            continue
        if tensor.dtype not in allowed[name]:
            raise ArtifactContentError(f"dtype {tensor.dtype} is not an integer dtype", name)
        if tensor.shape != ids.shape:
            raise ArtifactContentError(
                f"shape {list(tensor.shape)} differs from input_ids' {list(ids.shape)}", name
            )


def check_kind(kind: str, info: SafetensorsInfo) -> None:
    """Dispatch on the artifact kind; job outputs are written by the workers, unchecked."""
    if kind == "checkpoint":
        check_checkpoint(info)
    elif kind == "dataset":
        check_dataset(info)

"""What each artifact kind must hold, checked from the validated safetensors header alone.

These checks need no torch and no data: they run on upload (and on ``file://`` artifacts
when a job starts). Checks against a model spec (names, shapes, token ranges) happen in
the worker, with the engine's own loaders.
"""

from __future__ import annotations

from curvplan_server.artifacts.safetensors_format import SafetensorsInfo

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
INT_DTYPES = frozenset({"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"})
DATASET_TENSORS = ("inputs", "targets")


class ArtifactContentError(ValueError):
    """A well-formed safetensors file that is not a usable artifact of its kind."""

    def __init__(self, reason: str, tensor: str | None = None) -> None:
        super().__init__(reason if tensor is None else f"tensor {tensor!r}: {reason}")
        self.reason = reason
        self.tensor = tensor


def check_checkpoint(info: SafetensorsInfo) -> None:
    """A checkpoint holds at least one tensor and only floating-point parameters."""
    if not info.tensors:
        raise ArtifactContentError("a checkpoint must hold at least one tensor")
    for name, tensor in sorted(info.tensors.items()):
        if tensor.dtype not in FLOAT_DTYPES:
            raise ArtifactContentError(
                f"checkpoint parameters must be floating point ({', '.join(sorted(FLOAT_DTYPES))})"
                f", found {tensor.dtype}",
                name,
            )


def check_dataset(info: SafetensorsInfo) -> None:
    """A dataset holds exactly ``inputs`` and ``targets``, numeric, with the same length."""
    names = set(info.tensors)
    for required in DATASET_TENSORS:
        if required not in names:
            raise ArtifactContentError(
                f"a dataset must hold tensors 'inputs' and 'targets'; found {sorted(names)}",
                required,
            )
    for extra in sorted(names - set(DATASET_TENSORS)):
        raise ArtifactContentError("a dataset holds only 'inputs' and 'targets'", extra)
    for name in DATASET_TENSORS:
        tensor = info.tensors[name]
        if tensor.dtype not in FLOAT_DTYPES | INT_DTYPES:
            raise ArtifactContentError(f"dtype {tensor.dtype} is neither integer nor float", name)
        if not tensor.shape or tensor.shape[0] == 0:
            raise ArtifactContentError(
                f"needs a first dimension of examples (≥ 1), found shape {list(tensor.shape)}",
                name,
            )
    n_inputs = info.tensors["inputs"].shape[0]
    n_targets = info.tensors["targets"].shape[0]
    if n_inputs != n_targets:
        raise ArtifactContentError(f"{n_targets} examples but 'inputs' has {n_inputs}", "targets")


def check_kind(kind: str, info: SafetensorsInfo) -> None:
    """Dispatch on the artifact kind; job outputs are written by the workers, unchecked."""
    if kind == "checkpoint":
        check_checkpoint(info)
    elif kind == "dataset":
        check_dataset(info)

"""Evaluation samples: a safetensors file with ``inputs`` and ``targets`` checked against the
spec's task, and the fixed batching every product uses (docs/numerics.md#loss-normalisation).

An optional ``groups`` tensor (int64, shape (n,)) gives every example a group id, e.g. the
document its window was cut from; the planner then measures the loss accuracy with a
cluster-robust variance over those groups (docs/numbers.md#evaluation-set-size)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from curvplan.types.spec import CausalLMTask, ClassificationTask, ModelSpec, RegressionTask
from curvplan_worker.curvature.checkpoint import read_safetensors
from curvplan_worker.curvature.objective import IGNORE_INDEX


class DataError(ValueError):
    """The evaluation sample does not fit the spec; the message names the tensor."""


@dataclass
class Dataset:
    """Inputs and targets of an evaluation sample (first dimension = examples)."""

    inputs: Tensor
    targets: Tensor
    groups: Tensor | None = None

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def to(self, device: torch.device, dtype: torch.dtype) -> Dataset:
        """Move to ``device``; float tensors are cast to ``dtype``, int tensors kept."""

        def move(t: Tensor) -> Tensor:
            return t.to(device, dtype) if t.is_floating_point() else t.to(device)

        return Dataset(move(self.inputs), move(self.targets), self.groups)

    def subset(self, index: Tensor | slice) -> Dataset:
        groups = None if self.groups is None else self.groups[index]
        return Dataset(self.inputs[index], self.targets[index], groups)

    def batches(self, batch_size: int | None) -> list[tuple[Tensor, Tensor]]:
        """Consecutive batches in file order (no shuffling, last batch kept even if short)."""
        n = len(self)
        size = n if not batch_size or batch_size >= n else int(batch_size)
        return [(self.inputs[i : i + size], self.targets[i : i + size]) for i in range(0, n, size)]


def _fail(name: str, msg: str) -> DataError:
    return DataError(f"data tensor {name!r}: {msg}")


def _check_tokens(name: str, t: Tensor, low: int, high: int, allow_ignore: bool) -> None:
    if t.dtype not in (torch.int64, torch.int32):
        raise _fail(name, f"expected int64 token ids, found dtype {t.dtype}")
    valid = (t >= low) & (t < high)
    if allow_ignore:
        valid |= t == IGNORE_INDEX
    if not bool(valid.all()):
        bad = t[~valid][0].item()
        extra = f" or {IGNORE_INDEX}" if allow_ignore else ""
        raise _fail(name, f"values must lie in [{low}, {high}){extra}; found {bad}")


def _check_float(name: str, t: Tensor) -> None:
    if not t.is_floating_point():
        raise _fail(name, f"expected floating-point values, found dtype {t.dtype}")
    if not bool(torch.isfinite(t).all()):
        raise _fail(name, "contains NaN or infinite values")


def _check_shape(name: str, t: Tensor, expected: tuple, what: str) -> None:
    ok = t.dim() == len(expected) and all(
        e is None or s == e for s, e in zip(t.shape, expected, strict=True)
    )
    if not ok:
        shown = tuple("n" if e is None else e for e in expected)
        raise _fail(name, f"expected shape {shown} ({what}), found {tuple(t.shape)}")


def _check_groups(groups: Tensor | None, n: int) -> Tensor | None:
    """``groups``: one integer group id per example (kept on the host)."""
    if groups is None:
        return None
    if groups.dtype not in (torch.int64, torch.int32):
        raise _fail("groups", f"expected int64 group ids, found dtype {groups.dtype}")
    _check_shape("groups", groups, (n,), "one group id per example")
    return groups.long().cpu()


def validate_dataset(spec: ModelSpec, data: Dataset) -> Dataset:
    """Check shapes, dtypes and value ranges against the task; int32 tokens become int64."""
    checked = _validate_tensors(spec, data)
    return Dataset(checked.inputs, checked.targets, _check_groups(data.groups, len(checked)))


def _validate_tensors(spec: ModelSpec, data: Dataset) -> Dataset:
    task = spec.task
    x, y = data.inputs, data.targets
    if x.dim() == 0 or x.shape[0] == 0:
        raise _fail("inputs", "needs at least one example")
    n = x.shape[0]
    if y.dim() == 0 or y.shape[0] != n:
        raise _fail("targets", f"expected {n} examples like 'inputs', found shape {tuple(y.shape)}")
    seq = x.shape[1] if x.dim() > 1 else 0
    if x.dim() > 1 and not (1 <= seq <= task.seq_len):
        raise _fail("inputs", f"sequence length {seq} must be between 1 and {task.seq_len}")
    if isinstance(task, CausalLMTask):
        _check_shape("inputs", x, (n, seq), "token ids")
        _check_tokens("inputs", x, 0, task.vocab_size, allow_ignore=False)
        _check_shape("targets", y, (n, seq), "next-token ids")
        _check_tokens("targets", y, 0, task.vocab_size, allow_ignore=True)
        if not bool((y != IGNORE_INDEX).any()):
            raise _fail("targets", f"every target is {IGNORE_INDEX}: no loss terms")
        return Dataset(x.long(), y.long())
    if isinstance(task, ClassificationTask):
        if task.vocab_size is not None:
            _check_shape("inputs", x, (n, seq), "token ids")
            _check_tokens("inputs", x, 0, task.vocab_size, allow_ignore=False)
            x = x.long()
        else:
            _check_shape("inputs", x, (n, seq, task.input_dim), "features")
            _check_float("inputs", x)
        _check_shape("targets", y, (n,), "class labels")
        _check_tokens("targets", y, 0, task.n_classes, allow_ignore=False)
        return Dataset(x, y.long())
    assert isinstance(task, RegressionTask)
    in_dim = task.input_dim or spec.d_model
    out_dim = task.output_dim or spec.d_model
    _check_shape("inputs", x, (n, seq, in_dim), "features")
    _check_float("inputs", x)
    _check_shape("targets", y, (n, seq, out_dim), "regression targets")
    _check_float("targets", y)
    return Dataset(x, y)


def load_dataset(spec: ModelSpec, path: str | Path) -> Dataset:
    """Read ``inputs``, ``targets`` (and the optional ``groups``) from a safetensors file and
    validate them."""
    tensors = read_safetensors(path, "data")
    missing = [k for k in ("inputs", "targets") if k not in tensors]
    if missing:
        raise DataError(f"data file {path}: missing tensor(s) {missing}; found {sorted(tensors)}")
    return validate_dataset(
        spec, Dataset(tensors["inputs"], tensors["targets"], tensors.get("groups"))
    )


def save_dataset(data: Dataset, path: str | Path) -> None:
    """Write a sample in the engine's format."""
    from safetensors.torch import save_file

    tensors = {"inputs": data.inputs.contiguous().cpu(), "targets": data.targets.contiguous().cpu()}
    if data.groups is not None:
        tensors["groups"] = data.groups.contiguous().cpu()
    save_file(tensors, str(path))

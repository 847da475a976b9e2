"""Strict safetensors checkpoint loading (engine contract parameter names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn


@dataclass
class TensorIssue:
    """One checkpoint tensor that does not fit the model."""

    name: str
    problem: str  # "missing" | "unexpected" | "shape" | "dtype" | "non-finite"
    expected: str | None = None
    found: str | None = None

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "problem": self.problem,
            "expected": self.expected,
            "found": self.found,
        }


@dataclass(eq=False)
class CheckpointMismatch(ValueError):
    """The checkpoint does not match the model; ``issues`` lists every offending tensor."""

    path: str
    issues: list[TensorIssue] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        groups: dict[str, list[str]] = {}
        for issue in self.issues:
            text = issue.name
            if issue.expected is not None or issue.found is not None:
                text += f" (expected {issue.expected}, found {issue.found})"
            groups.setdefault(issue.problem, []).append(text)
        parts = [f"{problem}: {', '.join(names)}" for problem, names in groups.items()]
        return f"checkpoint {self.path} does not match the model spec — " + "; ".join(parts)

    def as_dict(self) -> dict:
        return {"path": self.path, "issues": [i.as_dict() for i in self.issues]}


class CheckpointError(ValueError):
    """The checkpoint file cannot be read."""


def read_safetensors(path: str | Path, what: str) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file; unreadable files raise a ``ValueError`` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"{what} file not found: {path}") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"{what} file {path} is not a readable safetensors file: {exc}"
        ) from None


def check_state(model: nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """Raise :class:`CheckpointMismatch` listing missing, unexpected, mis-shaped and non-float
    tensors, all at once."""
    expected = dict(model.named_parameters())
    issues: list[TensorIssue] = []
    for name, param in expected.items():
        if name not in state:
            issues.append(TensorIssue(name, "missing", str(tuple(param.shape)), None))
    for name, tensor in state.items():
        if name not in expected:
            issues.append(TensorIssue(name, "unexpected", None, str(tuple(tensor.shape))))
            continue
        param = expected[name]
        if tuple(tensor.shape) != tuple(param.shape):
            issues.append(
                TensorIssue(name, "shape", str(tuple(param.shape)), str(tuple(tensor.shape)))
            )
        if not tensor.is_floating_point():
            issues.append(TensorIssue(name, "dtype", "a floating dtype", str(tensor.dtype)))
        elif (issue := non_finite_issue(name, tensor)) is not None:
            issues.append(issue)
    if issues:
        raise CheckpointMismatch(path, issues)


def non_finite_issue(name: str, tensor: torch.Tensor) -> TensorIssue | None:
    """The issue of a weight holding NaN or ±Inf (how many of its elements), else None."""
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return None
    bad = int((~finite).sum())
    return TensorIssue(
        name, "non-finite", "finite values", f"{bad} NaN or infinite of {finite.numel()}"
    )


def load_checkpoint(model: nn.Module, path: str | Path) -> nn.Module:
    """Load a safetensors checkpoint into ``model`` (cast to the model's dtype) after strict
    name/shape/dtype checks; returns the model."""
    state = read_safetensors(path, "checkpoint")
    check_state(model, state, str(path))
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(state[name].to(param.dtype))
    return model


def save_checkpoint(model: nn.Module, path: str | Path, *, step: int | None = None) -> None:
    """Write the model's parameters under the contract names (tied tensors once); ``step``
    goes to the safetensors metadata (``step``), where the noise-scale trend reads it."""
    from safetensors.torch import save_file

    tensors = {n: p.detach().contiguous().cpu() for n, p in model.named_parameters()}
    save_file(tensors, str(path), metadata=None if step is None else {"step": str(int(step))})

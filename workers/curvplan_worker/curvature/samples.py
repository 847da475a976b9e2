"""Sample plumbing shared by the per-example statistics (``per_sample``, ``gradient_noise``):
the parameters to differentiate, input checks naming the field, device moves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn


def select_parameters(
    model: nn.Module, param_names: Sequence[str] | None = None
) -> dict[str, Tensor]:
    """The chosen parameters (default: every parameter that requires grad), detached, in order.

    ``named_parameters()`` deduplicates tied tensors, so a tied weight appears once.
    """
    named = dict(model.named_parameters())
    if param_names is None:
        chosen = [name for name, p in named.items() if p.requires_grad]
    else:
        chosen = list(param_names)
        missing = [name for name in chosen if name not in named]
        if missing:
            raise ValueError(f"param_names: not parameters of the model: {missing}")
        if len(set(chosen)) != len(chosen):
            raise ValueError("param_names: duplicate names")
    if not chosen:
        raise ValueError("param_names: no parameters selected")
    return {name: named[name].detach() for name in chosen}


def numel(params: Mapping[str, Tensor]) -> int:
    """Total number of entries of ``params``."""
    return sum(p.numel() for p in params.values())


def check_sample(inputs: Tensor, targets: Tensor) -> int:
    """The number of examples; ValueError naming the field when inputs/targets disagree."""
    if inputs.ndim == 0 or targets.ndim == 0:
        raise ValueError("inputs/targets: need a leading example dimension")
    n = int(inputs.shape[0])
    if int(targets.shape[0]) != n:
        raise ValueError(
            f"targets: {targets.shape[0]} examples but inputs has {n} (leading dimensions differ)"
        )
    if n == 0:
        raise ValueError("inputs: the sample is empty")
    return n


def check_batch_size(batch_size: int) -> None:
    """ValueError naming ``batch_size`` unless it is at least 1."""
    if int(batch_size) < 1:
        raise ValueError(f"batch_size: must be ≥ 1, got {batch_size}")


def device_dtype(params: Mapping[str, Tensor]) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the first parameter (the model's)."""
    first = next(iter(params.values()))
    return first.device, first.dtype


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device`` (no copy when it is there already)."""
    return t.to(device) if t.device != device else t

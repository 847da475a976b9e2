"""A branch's optimizer state: AdamW's moments read from a safetensors file beside the
checkpoint, or warmed on the branch's own batches before its window counts.

A checkpoint holds weights only. A branch started with fresh Adam moments takes its first
steps with a noisy second-moment estimate (the first bias-corrected step is ±lr per
coordinate), which distorts the window's loss curves the branch sweep compares. Two remedies:

* the run's own moments, saved with :func:`save_moments` (tensors ``exp_avg.<parameter>`` and
  ``exp_avg_sq.<parameter>``, the optimizer's ``step`` in the metadata; safetensors, never a
  pickle), loaded with :func:`read_moments` and :func:`apply_moments`;
* otherwise :func:`warm_moments`: steps at learning rate 0 on batches of the branch's own size,
  which update the moments (m ← β₁m + (1 − β₁)g, v ← β₂v + (1 − β₂)g², Kingma & Ba 2015,
  Algorithm 1) and leave the weights where the checkpoint put them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from curvplan_worker.curvature.checkpoint import (
    CheckpointError,
    CheckpointMismatch,
    TensorIssue,
    check_state,
    read_safetensors,
)

MOMENT_KINDS = ("exp_avg", "exp_avg_sq")

#: The warm-up's batch order is its own seeded permutation, apart from the window's (whose
#: order every branch of a checkpoint shares).
WARMUP_SEED_OFFSET = 7_919


@dataclass(frozen=True, slots=True)
class OptimizerMoments:
    """AdamW's per-parameter first and second moments and its step count."""

    step: int
    exp_avg: dict[str, Tensor]
    exp_avg_sq: dict[str, Tensor]


def save_moments(model: nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Write an AdamW optimizer's moments for ``model``'s parameters as safetensors (the file
    a branch sweep takes in ``optimizer_states``)."""
    from safetensors.torch import save_file

    tensors: dict[str, Tensor] = {}
    step = 0
    for name, param in model.named_parameters():
        state = optimizer.state.get(param) or {}
        if "exp_avg" not in state:
            raise ValueError(f"the optimizer holds no Adam moments for {name}")
        for kind in MOMENT_KINDS:
            tensors[f"{kind}.{name}"] = state[kind].detach().contiguous().cpu()
        step = int(state["step"])
    save_file(tensors, str(path), metadata={"step": str(step), "optimizer": "adamw"})


def read_moments(path: str | Path, model: nn.Module) -> OptimizerMoments:
    """The moments of a safetensors optimizer-state file, checked against ``model``'s
    parameters (names, shapes, finite floats; all problems at once); raises
    ``CheckpointError`` / ``CheckpointMismatch`` naming the file."""
    from safetensors import safe_open

    tensors = read_safetensors(path, "optimizer state")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    try:
        step = int(metadata.get("step", ""))
    except ValueError:
        raise CheckpointError(
            f"optimizer state file {path} has no integer `step` in its metadata (the "
            "optimizer's step count, which Adam's bias correction needs)"
        ) from None
    if step < 1:
        raise CheckpointError(f"optimizer state file {path}: step must be ≥ 1, got {step}")
    parts: dict[str, dict[str, Tensor]] = {kind: {} for kind in MOMENT_KINDS}
    stray = []
    for key, tensor in tensors.items():
        kind, _, name = key.partition(".")
        if kind in parts and name:
            parts[kind][name] = tensor
        else:
            stray.append(key)
    if stray:
        raise CheckpointError(
            f"optimizer state file {path}: tensors must be named exp_avg.<parameter> or "
            f"exp_avg_sq.<parameter>, got {', '.join(sorted(stray)[:5])}"
        )
    issues: list[TensorIssue] = []
    for kind, state in parts.items():
        try:
            check_state(model, state, str(path))
        except CheckpointMismatch as exc:
            issues += [replace(issue, name=f"{kind}.{issue.name}") for issue in exc.issues]
    if issues:
        raise CheckpointMismatch(str(path), issues)
    negative = [n for n, v in parts["exp_avg_sq"].items() if bool((v < 0).any())]
    if negative:
        raise CheckpointError(
            f"optimizer state file {path}: exp_avg_sq is negative in {', '.join(negative[:5])}"
        )
    return OptimizerMoments(step, parts["exp_avg"], parts["exp_avg_sq"])


def apply_moments(
    optimizer: torch.optim.Optimizer, model: nn.Module, moments: OptimizerMoments
) -> None:
    """Give ``optimizer`` (AdamW over ``model``'s parameters) the saved moments and step."""
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        raise ValueError("an optimizer state holds Adam's moments: the optimizer is not AdamW")
    for name, param in model.named_parameters():
        optimizer.state[param] = {
            "step": torch.tensor(float(moments.step)),
            "exp_avg": moments.exp_avg[name].to(param.dtype).clone(),
            "exp_avg_sq": moments.exp_avg_sq[name].to(param.dtype).clone(),
        }


def warm_moments(
    optimizer: torch.optim.Optimizer, set_gradients: Callable[[], None], steps: int
) -> None:
    """``steps`` optimizer steps at learning rate 0: each calls ``set_gradients`` (which puts
    the next batch's gradient in ``.grad``) and steps, so the moments follow Adam's
    recursions on those gradients while no weight moves (AdamW's decoupled decay and update
    are both scaled by the learning rate). The learning rates are restored afterwards."""
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    try:
        for _ in range(steps):
            set_gradients()
            optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = lr


def warmup_order(n: int, seed: int) -> Tensor:
    """The warm-up's example order: a seeded permutation apart from the window's."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + WARMUP_SEED_OFFSET))

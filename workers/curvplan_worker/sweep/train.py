"""One training run of a sweep: train to a target evaluation loss (batch sweep) or for a fixed
number of steps with a decayed schedule over them (data sweep: its size's own steps,
``curvplan.types.sweep.data_steps``), measuring two-batch gradient norms on the way.

Pure functions of tensors (no database, no job): the ``sweep_point`` kind calls
:func:`train_point` on loaded artifacts, and validation studies call it in-process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from curvplan.types.sweep import OptimizerSpec, PointResult, PointSettings, TwoBatchWindows
from curvplan_worker.curvature.data import Dataset
from curvplan_worker.curvature.objective import Objective
from curvplan_worker.sweep.lr import lr_at_step, lr_for_batch
from curvplan_worker.sweep.moments import (
    OptimizerMoments,
    apply_moments,
    warm_moments,
    warmup_order,
)

__all__ = ["eval_loss", "lr_for_batch", "nested_order", "train_point"]

Report = Callable[[float, str, str], None]


def make_optimizer(params: list[nn.Parameter], spec: OptimizerSpec, lr: float):
    if spec.name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
    return torch.optim.AdamW(params, lr=lr, weight_decay=spec.weight_decay)


def nested_order(n: int, seed: int) -> Tensor:
    """A fixed permutation of the training examples: data-sweep subsets are its prefixes, so
    every smaller subset is contained in every larger one."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def eval_loss(objective: Objective, model: nn.Module, data: Dataset, batch: int = 256) -> float:
    """Mean per-term loss over the whole evaluation set (sum of losses / sum of counts)."""
    total = 0.0
    count = 0.0
    for x, y in data.batches(batch):
        losses, counts = objective.example_losses(model, x, y)
        total += float(losses.sum())
        count += float(counts.sum())
    return total / count


def _flat_grad(params: list[nn.Parameter]) -> Tensor:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    )


def _half_gradient(
    objective: Objective, model: nn.Module, params: list[nn.Parameter], x: Tensor, y: Tensor
) -> tuple[Tensor, float, float]:
    model.zero_grad(set_to_none=True)
    losses, counts = objective.example_losses(model, x, y)
    loss = losses.sum() / counts.sum()
    loss.backward()
    return _flat_grad(params), float(counts.sum()), float(loss.detach())


def train_point(
    model: nn.Module,
    objective: Objective,
    train: Dataset,
    evaluation: Dataset,
    point: PointSettings,
    optimizer_spec: OptimizerSpec,
    *,
    report: Report | None = None,
    on_step: Callable[[int, nn.Module], None] | None = None,
    moments: OptimizerMoments | None = None,
) -> PointResult:
    """Train ``model`` in place for one sweep point; what it measured.

    Each step draws ``batch_size`` examples (epochs over a seeded permutation of ``train``,
    or of its first ``data_size`` examples of :func:`nested_order`), computes the gradients
    of the two halves of the batch separately and steps on their count-weighted mean (the
    full batch's gradient). The halves' squared norms are the two-batch estimator's input
    (McCandlish et al. 2018, App. A, eq. A.2–A.3). The learning rate warms up linearly over
    ``optimizer.warmup_steps`` and then follows ``point.schedule`` over ``max_steps``
    (:func:`curvplan_worker.sweep.lr.lr_at_step`: constant, cosine, or warmup-stable-decay).

    ``on_step(step, model)``, when given, is called before each step with the model at the
    weights the step's gradients are taken at (validation studies compute closed forms there).

    Batch sweep: stops at the first evaluation with loss ≤ ``target_loss``; the steps to
    target are interpolated linearly in loss between the last two evaluations. Data sweep:
    runs the whole decayed schedule (an early stop would end it at a high learning rate and
    bias L(D) upward) and reports the best evaluation. Branch sweep: runs its window of
    ``max_steps`` steps and evaluates every ``eval_every``; its batch order does not depend on
    the batch size, so every branch of a checkpoint sees the same examples in the same order.
    Its optimizer starts from ``moments`` (the checkpoint's AdamW state) when given, else from
    ``point.moment_warmup_steps`` steps at learning rate 0 on batches of its own size drawn
    apart from the window (:mod:`curvplan_worker.sweep.moments`); the weights and the window
    are the same either way.
    """
    started = time.monotonic()
    b = point.batch_size
    half = b // 2
    n_train = len(train)
    if point.data_size is not None:
        if point.data_size > n_train:
            raise ValueError(
                f"point.data_size: {point.data_size} exceeds the training data ({n_train})"
            )
        train = train.subset(nested_order(n_train, point.seed)[: point.data_size])
        n_train = len(train)
    # a branch sweep's branches share one example order, so at equal tokens they saw the same data
    gen = torch.Generator().manual_seed(
        point.seed * 1_000_003 + (0 if point.type == "branch" else b)
    )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, optimizer_spec, point.lr)
    model.train()
    optimizer_start = _start_optimizer(opt, model, objective, train, point, moments)
    warmup = optimizer_spec.warmup_steps
    order = torch.randperm(n_train, generator=gen)
    cursor = 0

    def next_batch() -> Tensor:
        nonlocal order, cursor
        picked = []
        need = b
        while need > 0:
            if cursor >= n_train:
                order = torch.randperm(n_train, generator=gen)
                cursor = 0
            take = order[cursor : cursor + need]
            cursor += int(take.numel())
            need -= int(take.numel())
            picked.append(take)
        return torch.cat(picked)

    tokens_per_example = None
    eval_steps: list[int] = [0]
    eval_losses: list[float] = [eval_loss(objective, model, evaluation)]
    best, best_step = eval_losses[0], 0
    window_ends: list[int] = []
    window_losses: list[float] = []
    small: list[list[float]] = []
    big: list[list[float]] = []
    cur_small: list[float] = []
    cur_big: list[float] = []
    reached = point.type == "batch" and eval_losses[0] <= (point.target_loss or -math.inf)
    steps_to_target: float | None = 0.0 if reached else None
    step = 0
    while not reached and step < point.max_steps:
        idx = next_batch()
        x, y = train.inputs[idx], train.targets[idx]
        if on_step is not None:
            on_step(step, model)
        g1, c1, _ = _half_gradient(objective, model, params, x[:half], y[:half])
        g2, c2, _ = _half_gradient(objective, model, params, x[half:], y[half:])
        if tokens_per_example is None:
            tokens_per_example = (c1 + c2) / b
        g = (c1 * g1 + c2 * g2) / (c1 + c2)
        cur_small.append(0.5 * (float(g1 @ g1) + float(g2 @ g2)))
        cur_big.append(float(g @ g))
        offset = 0
        for p in params:
            numel = p.numel()
            p.grad = g[offset : offset + numel].view_as(p).clone()
            offset += numel
        lr = lr_at_step(
            step,
            point.lr,
            point.max_steps,
            warmup_steps=warmup,
            schedule=point.schedule,
            cooldown_fraction=point.cooldown_fraction,
        )
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        step += 1
        if step % point.eval_every == 0 or step == point.max_steps:
            model.eval()
            loss = eval_loss(objective, model, evaluation)
            model.train()
            window_ends.append(step)
            window_losses.append(eval_losses[-1])
            small.append(cur_small)
            big.append(cur_big)
            cur_small, cur_big = [], []
            prev_step, prev_loss = eval_steps[-1], eval_losses[-1]
            eval_steps.append(step)
            eval_losses.append(loss)
            if not math.isfinite(loss):
                raise FloatingPointError(f"evaluation loss became {loss} at step {step}")
            if loss < best:
                best, best_step = loss, step
            target = point.target_loss
            if point.type == "batch" and target is not None and loss <= target:
                reached = True
                drop = prev_loss - loss
                frac = (prev_loss - target) / drop if drop > 0 else 1.0
                steps_to_target = prev_step + min(max(frac, 0.0), 1.0) * (step - prev_step)
            if report is not None:
                report(step / point.max_steps, "training", f"step {step}, eval loss {loss:.4f}")
    model.eval()
    censored = point.type == "batch" and not reached
    if point.type == "batch":
        steps = float(steps_to_target) if steps_to_target is not None else float(step)
    elif point.type == "branch":
        steps = float(step)
    else:
        steps = float(best_step)
    return PointResult(
        batch_size=b,
        batch_size_tokens=None if tokens_per_example is None else b * tokens_per_example,
        lr=point.lr,
        lr_multiplier=point.lr_multiplier,
        data_size=point.data_size,
        reached_target=bool(reached),
        censored=censored,
        steps=steps,
        examples=steps * b,
        best_eval_loss=best,
        best_step=best_step,
        eval_steps=eval_steps,
        eval_losses=eval_losses,
        two_batch=TwoBatchWindows(
            b_small=half,
            b_big=b,
            window_end_steps=window_ends,
            window_eval_losses=window_losses,
            grad_sq_norm_small=small,
            grad_sq_norm_big=big,
        )
        if window_ends
        else None,
        optimizer_start=optimizer_start,
        seconds=time.monotonic() - started,
    )


def _start_optimizer(
    opt: torch.optim.Optimizer,
    model: nn.Module,
    objective: Objective,
    train: Dataset,
    point: PointSettings,
    moments: OptimizerMoments | None,
) -> str:
    """The optimizer's state before the first counted step, and how it was set, in words."""
    if moments is not None:
        apply_moments(opt, model, moments)
        return f"the checkpoint's AdamW moments (optimizer state at step {moments.step})"
    steps = point.moment_warmup_steps
    if steps == 0:
        return "fresh"
    b, n = point.batch_size, len(train)
    order = warmup_order(n, point.seed)
    cursor = 0

    def set_gradients() -> None:
        nonlocal cursor
        idx = order[torch.arange(cursor, cursor + b) % n]
        cursor += b
        model.zero_grad(set_to_none=True)
        losses, counts = objective.example_losses(model, train.inputs[idx], train.targets[idx])
        (losses.sum() / counts.sum()).backward()

    warm_moments(opt, set_gradients, steps)
    model.zero_grad(set_to_none=True)
    return (
        f"moments warmed over {steps} steps at learning rate 0 on batches of {b} drawn apart "
        "from the window (weights unchanged)"
    )

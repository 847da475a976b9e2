"""The benchmark's own training loop (independent of ``curvplan_worker.sweep``).

AdamW on the mean next-character cross-entropy, batches drawn as epochs over a seeded
permutation of the training examples, a linear warm-up and then either a constant learning
rate (steps-to-target runs, McCandlish et al. 2018 §2.2 measure S at a fixed lr) or a cosine
decay to zero over a fixed horizon (data runs: a decayed schedule, Hägele et al. 2024).
The held-out loss is the mean over every token of a fixed evaluation set.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


def mean_token_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy over every (example, position) of the batch."""
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def held_out_loss(model: nn.Module, x: Tensor, y: Tensor, chunk: int = 512) -> float:
    """Mean token loss over the whole evaluation set (every example has seq_len tokens)."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(x), chunk):
        total += float(mean_token_loss(model, x[i : i + chunk], y[i : i + chunk])) * len(
            x[i : i + chunk]
        )
    model.train(was_training)
    return total / len(x)


@dataclass
class RunResult:
    """One training run: what it reached and when."""

    batch_size: int
    lr: float
    schedule: str
    steps_run: int
    eval_steps: list[int] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)
    steps_to_target: float | None = None
    diverged: bool = False
    seconds: float = 0.0

    @property
    def best_loss(self) -> float:
        finite = [v for v in self.eval_losses if math.isfinite(v)]
        return min(finite) if finite else math.inf

    def as_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "lr": self.lr,
            "schedule": self.schedule,
            "steps_run": self.steps_run,
            "steps_to_target": self.steps_to_target,
            "best_loss": self.best_loss,
            "final_loss": self.eval_losses[-1] if self.eval_losses else None,
            "diverged": self.diverged,
            "eval_steps": self.eval_steps,
            "eval_losses": [round(v, 5) for v in self.eval_losses],
            "seconds": round(self.seconds, 2),
        }


def crossing_step(steps: list[int], losses: list[float], target: float) -> float | None:
    """The first step at which the loss curve reaches ``target``, linear between the two
    evaluations that bracket it (None when it never does)."""
    for i, loss in enumerate(losses):
        if loss <= target:
            if i == 0:
                return float(steps[0])
            drop = losses[i - 1] - loss
            frac = (losses[i - 1] - target) / drop if drop > 0 else 1.0
            return steps[i - 1] + min(max(frac, 0.0), 1.0) * (steps[i] - steps[i - 1])
    return None


def train(
    model: nn.Module,
    train_x: Tensor,
    train_y: Tensor,
    eval_x: Tensor,
    eval_y: Tensor,
    *,
    batch_size: int,
    lr: float,
    max_steps: int,
    seed: int,
    schedule: str = "constant",
    warmup: int = 10,
    target: float | None = None,
    eval_growth: float = 1.1,
    min_eval_gap: int = 4,
    eval_every: int | None = None,
    weight_decay: float = 0.0,
    on_eval: Callable[[int, nn.Module], None] | None = None,
    save_at: tuple[int, ...] = (),
    on_save: Callable[[int, nn.Module], None] | None = None,
) -> RunResult:
    """Train ``model`` in place.

    ``schedule``: ``constant`` (warm-up, then ``lr``) or ``cosine`` (warm-up, then
    ``lr·½(1 + cos(π t/T))`` with T = ``max_steps``). Evaluations: every ``eval_every`` steps,
    or at steps growing geometrically by ``eval_growth`` (at least ``min_eval_gap`` apart) so
    the steps to the target are resolved to a few per cent at any length. With ``target``
    the run stops at the first evaluation at or below it.
    """
    started = time.process_time()
    gen = torch.Generator().manual_seed(seed)
    n = len(train_x)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    order = torch.randperm(n, generator=gen)
    cursor = 0
    result = RunResult(batch_size=batch_size, lr=lr, schedule=schedule, steps_run=0)
    model.train()

    def evaluate(step: int) -> float:
        loss = held_out_loss(model, eval_x, eval_y)
        result.eval_steps.append(step)
        result.eval_losses.append(loss)
        if on_eval is not None:
            on_eval(step, model)
        return loss

    def next_eval(step: int) -> int:
        if eval_every is not None:
            return step + eval_every
        return max(step + min_eval_gap, math.ceil(step * eval_growth))

    loss0 = evaluate(0)
    if target is not None and loss0 <= target:
        result.steps_to_target = 0.0
        return result
    upcoming = next_eval(0)
    for step in range(1, max_steps + 1):
        if step - 1 in save_at and on_save is not None:
            on_save(step - 1, model)
        picked = []
        need = batch_size
        while need:
            if cursor >= n:
                order = torch.randperm(n, generator=gen)
                cursor = 0
            take = order[cursor : cursor + need]
            cursor += len(take)
            need -= len(take)
            picked.append(take)
        idx = torch.cat(picked)
        if step <= warmup:
            rate = lr * step / warmup
        elif schedule == "cosine":
            rate = lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (max_steps - warmup)))
        else:
            rate = lr
        for group in opt.param_groups:
            group["lr"] = rate
        loss = mean_token_loss(model, train_x[idx], train_y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        result.steps_run = step
        if not math.isfinite(float(loss.detach())):
            result.diverged = True
            break
        if step >= upcoming or step == max_steps:
            value = evaluate(step)
            upcoming = next_eval(step)
            if not math.isfinite(value):
                result.diverged = True
                break
            if target is not None and value <= target:
                result.steps_to_target = crossing_step(
                    result.eval_steps, result.eval_losses, target
                )
                break
    if max_steps in save_at and on_save is not None and result.steps_run == max_steps:
        on_save(max_steps, model)
    model.eval()
    result.seconds = time.process_time() - started
    return result


def to_tensors(x: np.ndarray, y: np.ndarray) -> tuple[Tensor, Tensor]:
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))

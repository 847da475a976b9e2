"""Learning rate per batch size and per step (torch-free: the sweep parent plans points with it)."""

from __future__ import annotations

import math
from typing import Literal

from curvplan.types.sweep import OptimizerSpec

Schedule = Literal["constant", "cosine", "wsd"]


def lr_for_batch(optimizer: OptimizerSpec, batch_size: int, multiplier: float = 1.0) -> float:
    """Peak learning rate at ``batch_size`` under the sweep's rule.

    sqrt: lr·√(B/B₀) (the square-root rule for adaptive optimizers, Malladi et al. 2022);
    linear: lr·B/B₀ (Goyal et al. 2017); constant: lr; grid: the sqrt rule × ``multiplier``.
    """
    ratio = batch_size / optimizer.base_batch_size
    if optimizer.lr_rule == "linear":
        base = optimizer.lr * ratio
    elif optimizer.lr_rule == "constant":
        base = optimizer.lr
    else:
        base = optimizer.lr * math.sqrt(ratio)
    return base * multiplier


def lr_at_step(
    step: int,
    peak: float,
    total_steps: int,
    *,
    warmup_steps: int = 0,
    schedule: Schedule = "constant",
    cooldown_fraction: float = 0.2,
) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of a run of ``total_steps`` steps.

    Warm-up (every schedule): η_t = η·(t + 1)/W for t < W. After it, with T the horizon:

    * constant: η_t = η;
    * cosine: η_t = η·½(1 + cos(π·(t + 1 − W)/(T − W))), reaching 0 at the last step
      (Loshchilov & Hutter 2017, SGDR eq. 5 with η_min = 0 and one cycle);
    * wsd (warmup-stable-decay): η_t = η until the cooldown of C = ⌈c·T⌉ steps, then
      η_t = η·(1 − √((t + 1 − (T − C))/C)), the "1 − sqrt" cooldown to 0 that Hägele et al.
      2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations",
      §3, eq. 1) find matches cosine.
    """
    if step < 0 or total_steps < 1:
        raise ValueError(f"step {step} / total_steps {total_steps}: need step ≥ 0, total ≥ 1")
    if warmup_steps > 0 and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "constant":
        return peak
    t = min(step + 1, total_steps)
    if schedule == "cosine":
        span = max(total_steps - warmup_steps, 1)
        done = min(max(t - warmup_steps, 0), span)
        return peak * 0.5 * (1.0 + math.cos(math.pi * done / span))
    if schedule == "wsd":
        cooldown = max(1, math.ceil(cooldown_fraction * total_steps))
        start = total_steps - cooldown
        if t <= start:
            return peak
        return peak * (1.0 - math.sqrt((t - start) / cooldown))
    raise ValueError(f"schedule: unknown {schedule!r}")


def interpolated_multiplier(
    sizes: tuple[float, float], multipliers: tuple[float, float], size: float
) -> float:
    """The learning-rate multiplier for data size ``size`` between the two grid-tuned ends:
    log-linear in log D, log m(D) = log m₀ + (log m₁ − log m₀)·(log D − log D₀)/(log D₁ − log D₀)
    (the data sweep's stated rule; docs/budget.md)."""
    (d0, d1), (m0, m1) = sizes, multipliers
    if d1 == d0:
        return m0
    frac = (math.log(size) - math.log(d0)) / (math.log(d1) - math.log(d0))
    return math.exp(math.log(m0) + frac * (math.log(m1) - math.log(m0)))

"""Batch sweeps at several training-set sizes, generated from a known batch scaling law (the
ground truth of the batch_sweeps import tests).

At D tokens the critical batch is B_crit(D) = C·D^GAMMA (Zhang et al. 2024; Bergsma et al.
2025) and a run at batch B reaches the target loss at exactly S = S_min(D)(1 + B_crit(D)/B)
(McCandlish et al. 2018, eq. 2.11) on a smooth falling curve, evaluated every ``EVAL_EVERY``
steps and stopped at its first evaluation at or below the target: the first logged step at or
below it is ⌈S/EVAL_EVERY⌉·EVAL_EVERY.
"""

from __future__ import annotations

import math
from typing import Any

GAMMA = 0.5
C = 64.0 / 1e8**GAMMA  # B_crit(1e8 tokens) = 64 examples
TOKENS = (1e7, 4e7, 1.6e8, 6.4e8)
TARGET_TOKENS = 4e9  # 6.25× the largest pilot: within the law's unflagged range
BATCH_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
TOKENS_PER_EXAMPLE = 512
TARGET = 2.5
EVAL_EVERY = 5


def b_crit(tokens: float) -> float:
    return C * tokens**GAMMA


def s_min(tokens: float) -> float:
    return 400.0 * (tokens / TOKENS[0]) ** 0.2


def steps_for(tokens: float, batch: int) -> float:
    return s_min(tokens) * (1.0 + b_crit(tokens) / batch)


def logged_crossing(tokens: float, batch: int) -> int:
    """The first logged step at or below the target: the truth the import must find."""
    return math.ceil(steps_for(tokens, batch) / EVAL_EVERY - 1e-9) * EVAL_EVERY


def expected_sweeps(tokens: tuple[float, ...] = TOKENS) -> list[dict[str, Any]]:
    """The batch_sweeps the import must build: every size's logged crossings."""
    return [
        {
            "tokens": d,
            "steps_to_target": [
                {"batch_size": b, "steps": logged_crossing(d, b), "steps_uncertainty": EVAL_EVERY}
                for b in BATCH_SIZES
            ],
        }
        for d in tokens
    ]


def run_rows(tokens: float, batch: int, *, in_examples: bool = False) -> list[dict[str, Any]]:
    """One run's evaluations; its size as ``tokens``, or as ``examples`` (tokens ÷
    ``TOKENS_PER_EXAMPLE``) with ``in_examples``."""
    s = steps_for(tokens, batch)
    size = {"examples": tokens / TOKENS_PER_EXAMPLE} if in_examples else {"tokens": tokens}
    return [
        {"run": f"d{tokens:g}-b{batch}", "batch_size": batch, **size, "step": step,
         "loss": TARGET * (s / step) ** 0.5}  # falls through TARGET exactly at step S
        for step in range(EVAL_EVERY, logged_crossing(tokens, batch) + 1, EVAL_EVERY)
    ]  # fmt: skip


def sweep_rows(
    tokens: tuple[float, ...] = TOKENS,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
    *,
    in_examples: bool = False,
) -> list[dict[str, Any]]:
    return [r for d in tokens for b in batch_sizes for r in run_rows(d, b, in_examples=in_examples)]

"""A tracker export generated from known laws (the ground truth of the import tests).

Batch runs: each batch size B reaches the target loss at exactly S(B) = S_min(1 + B_crit/B)
(McCandlish et al. 2018, eq. 2.11) on a smooth falling curve and stops at its first
evaluation at or below it (a batch sweep's run), evaluated every ``EVAL_EVERY`` steps, so the
first logged step at or below the target is ⌈S/EVAL_EVERY⌉·EVAL_EVERY. Data runs: a run on D
examples ends at L(D) = E + A·D^(−β) after a schedule that decays onto it.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

S_MIN, B_CRIT = 407.0, 50.0
E, A, BETA = 1.8, 30.0, 0.35
TARGET = 2.5
EVAL_EVERY = 5
BATCH_SIZES = (8, 16, 32, 64, 128, 256, 512)
DATA_SIZES = (1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000)
BATCH_RUN_EXAMPLES = 10_000_000


def steps_for(batch: int) -> float:
    return S_MIN * (1.0 + B_CRIT / batch)


def logged_crossing(batch: int) -> int:
    """The first logged step at or below the target: the truth the import must find."""
    return math.ceil(steps_for(batch) / EVAL_EVERY - 1e-9) * EVAL_EVERY


def batch_run_rows(batch: int) -> list[dict[str, Any]]:
    s = steps_for(batch)
    rows = []
    for step in range(EVAL_EVERY, logged_crossing(batch) + 1, EVAL_EVERY):
        loss = TARGET * (s / step) ** 0.5  # falls through TARGET exactly at step S
        rows.append({"run": f"batch-{batch}", "batch_size": batch, "step": step, "loss": loss})
    for row in rows:
        row["examples"] = BATCH_RUN_EXAMPLES
    return rows


def data_run_rows(size: int, steps: int = 200) -> list[dict[str, Any]]:
    final = E + A * size ** (-BETA)
    return [
        {
            "run": f"data-{size}",
            "batch_size": 64,
            "examples": size,
            "step": step,
            "loss": final + 2.0 * (1.0 - step / steps) ** 2,  # decays onto L(D)
        }
        for step in range(EVAL_EVERY * 4, steps + 1, EVAL_EVERY * 4)
    ]


def all_rows() -> list[dict[str, Any]]:
    rows = [r for b in BATCH_SIZES for r in batch_run_rows(b)]
    return rows + [r for d in DATA_SIZES for r in data_run_rows(d)]


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path

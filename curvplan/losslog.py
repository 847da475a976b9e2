"""Report a training run's evaluation losses to ``curvplan agent`` (standard library only).

    from curvplan.losslog import log_loss
    log_loss(step, eval_loss, examples=step * batch_size)

Each call writes one JSON line ``{"step": …, "loss": …, "examples": …}`` to the file that
``$CURVPLAN_LOSS_FILE`` names (the agent sets it for its command), else to stdout; the agent
reads either (docs/budget.md#the-loss-protocol). Outside an agent it prints the line.
"""

from __future__ import annotations

import json
import os
import sys

LOSS_FILE_ENV = "CURVPLAN_LOSS_FILE"


def log_loss(
    step: int, loss: float, examples: float | None = None, tokens: float | None = None
) -> None:
    """Report the evaluation ``loss`` after ``step`` optimizer steps (``examples``/``tokens``:
    what the run has trained on so far, optional)."""
    record: dict[str, float | int] = {"step": int(step), "loss": float(loss)}
    if examples is not None:
        record["examples"] = float(examples)
    if tokens is not None:
        record["tokens"] = float(tokens)
    line = json.dumps(record) + "\n"
    path = os.environ.get(LOSS_FILE_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
    else:
        sys.stdout.write(line)
        sys.stdout.flush()

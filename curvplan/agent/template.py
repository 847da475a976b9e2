"""The agent's command template: ``python train.py --batch-size {batch_size} --lr {lr} …``.

The template is split like a shell line (:func:`shlex.split`, no shell runs it) and each word is
formatted with the claimed point's values, so a value never splits or joins words. Its
placeholders are checked when the agent starts (:func:`check_template`): an unknown name is an
error before anything runs. A placeholder the point has no value for (``data_size`` in a batch
sweep, ``target_loss`` in a data sweep) takes the agent's ``--default NAME=VALUE``, else the
point fails naming it.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from curvplan.types.agents import AgentJob

PLACEHOLDERS: dict[str, str] = {
    "batch_size": "examples per optimizer step",
    "data_size": "data sweep: train on the first data_size examples (none in a batch sweep)",
    "lr": "peak learning rate (the sweep's rule at this batch size)",
    "lr_multiplier": "the learning-rate grid multiplier of the point",
    "max_steps": "step cap (data sweep: the decayed schedule's length)",
    "eval_every": "evaluate every n steps",
    "target_loss": "batch sweep: the eval loss to train to (the command may stop there)",
    "seed": "initialisation and batch-order seed",
    "schedule": "constant | cosine | wsd (after warm-up)",
    "cooldown_fraction": "wsd: the share of the steps cooling down",
    "warmup_steps": "linear warm-up steps",
    "weight_decay": "the sweep's optimizer weight decay",
    "momentum": "the sweep's SGD momentum",
    "optimizer": "adamw | sgd",
    "output_dir": "a fresh directory for this attempt (the loss file is in it)",
    "job_id": "the point's job id",
    "attempt": "the attempt number (1, 2, … after a retry)",
    "sweep_id": "the sweep's job id",
    "name": "the point's name, e.g. B=16",
}
"""Every placeholder the template may name, and what it stands for."""


class TemplateError(ValueError):
    """The template is not usable (unknown placeholder, bad syntax, nothing to run)."""


def placeholders(template: str) -> list[str]:
    """The placeholder names ``template`` uses, in order (format specs allowed: ``{lr:.3g}``)."""
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise TemplateError(f"--command: {exc}") from None
    if not words:
        raise TemplateError("--command: empty; give the training command to run for each point")
    names = []
    for word in words:
        try:
            parsed = list(string.Formatter().parse(word))
        except ValueError as exc:
            raise TemplateError(f"--command: {exc} in {word!r} (write {{{{ for a brace)") from None
        names += [name for _, name, _, _ in parsed if name is not None]
    return names


def check_template(template: str, defaults: Mapping[str, str]) -> None:
    """Raise :class:`TemplateError` naming every unknown placeholder (and unknown defaults)."""
    names = placeholders(template)
    unknown = sorted(
        {n for n in names if n not in PLACEHOLDERS} | (set(defaults) - set(PLACEHOLDERS))
    )
    if unknown:
        listed = ", ".join(f"{{{n}}}" if n else "{} (a positional field)" for n in unknown)
        raise TemplateError(
            f"--command names unknown placeholder(s) {listed}; the known ones are "
            + ", ".join(f"{{{n}}}" for n in PLACEHOLDERS)
        )


def point_values(job: AgentJob, output_dir: Path) -> dict[str, str | int | float | None]:
    """The values of the placeholders for a claimed point (None: the point has none)."""
    point, opt = job.point, job.optimizer
    return {
        "batch_size": point.batch_size,
        "data_size": point.data_size,
        "lr": point.lr,
        "lr_multiplier": point.lr_multiplier,
        "max_steps": point.max_steps,
        "eval_every": point.eval_every,
        "target_loss": point.target_loss,
        "seed": point.seed,
        "schedule": point.schedule,
        "cooldown_fraction": point.cooldown_fraction,
        "warmup_steps": opt.warmup_steps,
        "weight_decay": opt.weight_decay,
        "momentum": opt.momentum,
        "optimizer": opt.name,
        "output_dir": str(output_dir),
        "job_id": str(job.job_id),
        "attempt": job.attempt,
        "sweep_id": None if job.sweep_id is None else str(job.sweep_id),
        "name": job.name,
    }


def render(template: str, values: Mapping[str, Any], defaults: Mapping[str, str]) -> list[str]:
    """The command's argv for one point; :class:`TemplateError` naming a placeholder the point
    has no value for and no ``--default`` gives."""
    names = placeholders(template)
    filled = {
        **defaults,
        **{k: v for k, v in values.items() if v is not None},
    }
    missing = sorted({n for n in names if n not in filled})
    if missing:
        raise TemplateError(
            f"the command names {', '.join('{' + n + '}' for n in missing)} but this point has "
            f"no value for it (a {'batch' if values.get('data_size') is None else 'data'}-sweep "
            f"point); give the agent --default {missing[0]}=VALUE"
        )
    try:
        return [word.format(**filled) for word in shlex.split(template)]
    except (ValueError, KeyError, IndexError) as exc:
        raise TemplateError(f"the command template does not format this point: {exc}") from None

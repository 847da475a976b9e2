"""Read a Hugging Face ``Trainer`` output folder as an analysis takes it: w* and its history.

``Trainer(args=TrainingArguments(output_dir=RUN_DIR, save_steps=…))`` writes one
``checkpoint-<step>`` subfolder per save: a ``save_pretrained`` directory (``config.json``,
``model.safetensors`` or indexed shards) plus ``trainer_state.json`` (``global_step`` and
``log_history``, the losses the run logged). Here the LAST checkpoint (or the one named) is w*
and every earlier one an intermediate checkpoint, oldest first, with its training step and the
training loss the run logged at or before it: the noise-scale trend over those checkpoints is
what answers ``budget.batch`` (docs/model-sources.md#trainer-run-folders).

Checked here, before anything is uploaded, each error naming the file and the field:

- the folder has ``checkpoint-<step>`` subfolders (a folder with only logs is refused);
- every ``trainer_state.json`` parses: a JSON object, ``global_step`` a non-negative integer
  equal to the folder's step, ``log_history`` a list of objects whose ``step`` is an integer
  and whose ``loss`` is a finite number;
- every checkpoint is a save of the same model as w*: the same architecture and sizes in its
  ``config.json`` and the same tensors (names and shapes) in its safetensors headers.

Pickled files the Trainer also writes (``optimizer.pt``, ``training_args.bin``, …) are never
opened. No torch, no ``transformers``: JSON and safetensors headers only.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from curvplan.client.pretrained import (
    CONFIG_FILE,
    HuggingFaceModelJson,
    PretrainedDir,
    PretrainedDirError,
    checkpoint_shapes,
    read_pretrained,
)
from curvplan.types.huggingface import ArchConfig, parse_hf_config

STATE_FILE = "trainer_state.json"
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


class TrainerRunError(PretrainedDirError):
    """The folder is not a usable Trainer output folder; the message names file and field."""


@dataclass(frozen=True)
class RunCheckpoint:
    """One ``checkpoint-<step>`` subfolder: its weights, step and the loss the run logged."""

    name: str
    step: int
    logged_loss: float | None
    """The last training ``loss`` of ``log_history`` at or before ``step`` (None: not logged)."""
    pretrained: PretrainedDir


@dataclass(frozen=True)
class TrainerRun:
    """A checked Trainer output folder: w* and the checkpoints before it, oldest first."""

    path: Path
    w_star: RunCheckpoint
    intermediates: tuple[RunCheckpoint, ...]

    @property
    def model(self) -> HuggingFaceModelJson:
        """The ``model`` field of an analyze or sweep request: w*'s ``config.json``."""
        return self.w_star.pretrained.model


def checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoint-<step>`` subfolder, by step."""
    found = []
    for child in root.iterdir():
        match = CHECKPOINT_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def is_trainer_run(value: Any) -> bool:
    """Whether ``value`` is the path of a Trainer output folder: a directory with
    ``checkpoint-<step>`` subfolders, or with a ``trainer_state.json`` and no ``config.json``
    of its own (a run whose checkpoints are missing: :func:`read_trainer_run` says so)."""
    if not isinstance(value, str | os.PathLike):
        return False
    root = Path(value)
    if not root.is_dir():
        return False
    if checkpoint_dirs(root):
        return True
    return (root / STATE_FILE).is_file() and not (root / CONFIG_FILE).is_file()


def read_trainer_run(path: str | os.PathLike[str], w_star: str | None = None) -> TrainerRun:
    """Read and check a Trainer output folder (module docstring).

    ``w_star`` names the checkpoint that is w* (``checkpoint-300``, or its step ``300``);
    default the last one. Only the checkpoints before it are intermediates. Raises
    :class:`TrainerRunError` naming the file and field.
    """
    root = Path(path)
    if not root.is_dir():
        raise TrainerRunError(f"{root}: not a directory (expected a Trainer output folder)")
    found = checkpoint_dirs(root)
    if not found:
        raise TrainerRunError(
            f"{root}: no checkpoint-<step> subfolders: a Trainer output folder holds one per "
            "save (TrainingArguments save_strategy='steps', save_steps=N); the checkpoints "
            "before w* give the noise-scale trend"
        )
    chosen = _chosen(root, found, w_star)
    checkpoints = [_checkpoint(step, folder) for step, folder in found if step <= chosen]
    last = checkpoints[-1]
    reference = parse_hf_config(last.pretrained.config)
    shapes = checkpoint_shapes(last.pretrained)
    for ckpt in checkpoints[:-1]:
        _same_model(ckpt, last, reference, shapes)
    return TrainerRun(root, last, tuple(checkpoints[:-1]))


def _chosen(root: Path, found: list[tuple[int, Path]], w_star: str | None) -> int:
    if w_star is None:
        return found[-1][0]
    steps = {folder.name: step for step, folder in found}
    name = f"checkpoint-{w_star}" if w_star.isdigit() else Path(w_star).name
    if name not in steps:
        listed = ", ".join(folder.name for _, folder in found)
        raise TrainerRunError(f"w*: {root} has no {name} (it has {listed})")
    return steps[name]


def _checkpoint(step: int, folder: Path) -> RunCheckpoint:
    try:
        pretrained = read_pretrained(folder)
    except PretrainedDirError as exc:
        raise TrainerRunError(str(exc)) from None
    state_path = folder / STATE_FILE
    logged = None
    if state_path.is_file():
        logged = _logged_loss(state_path, step)
    return RunCheckpoint(folder.name, step, logged, pretrained)


def _logged_loss(path: Path, step: int) -> float | None:
    """The last training loss logged at or before ``step``; checks the fields it reads."""
    try:
        state = json.loads(path.read_text())
    except OSError as exc:
        raise TrainerRunError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TrainerRunError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(state, dict):
        raise TrainerRunError(f"{path}: must be a JSON object (the Trainer's state)")
    global_step = state.get("global_step")
    if not _is_int(global_step) or global_step < 0:
        raise TrainerRunError(
            f"{path}: global_step must be a non-negative integer, got {global_step!r}"
        )
    if global_step != step:
        raise TrainerRunError(
            f"{path}: global_step is {global_step} but the folder is checkpoint-{step}"
        )
    history = state.get("log_history", [])
    if not isinstance(history, list):
        raise TrainerRunError(f"{path}: log_history must be a list, got {type(history).__name__}")
    loss = None
    for i, entry in enumerate(history):
        if not isinstance(entry, dict):
            raise TrainerRunError(f"{path}: log_history[{i}] must be an object")
        if "loss" not in entry:
            continue  # an eval or a summary entry: train_loss, eval_loss, train_runtime, …
        at, value = entry.get("step"), entry["loss"]
        if not _is_int(at) or at < 0:
            raise TrainerRunError(
                f"{path}: log_history[{i}].step must be a non-negative integer, got {at!r}"
            )
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise TrainerRunError(
                f"{path}: log_history[{i}].loss must be a finite non-negative number, got {value!r}"
            )
        if at <= step:
            loss = float(value)
    return loss


def _same_model(
    ckpt: RunCheckpoint,
    last: RunCheckpoint,
    w_star: ArchConfig,
    shapes: dict[str, list[int]],
) -> None:
    """A checkpoint of another model (architecture, sizes or tensors) is refused, by field."""
    config = parse_hf_config(ckpt.pretrained.config).model_dump()
    reference = w_star.model_dump()
    where = ckpt.pretrained.path / CONFIG_FILE
    for key in ["model_type", *sorted(set(reference) | set(config))]:  # the type first
        if config.get(key) != reference.get(key):
            raise TrainerRunError(
                f"{where}: {key} is {config.get(key)!r} but {last.name} (w*) has "
                f"{reference.get(key)!r}: the checkpoints of a run are saves of one model"
            )
    mine = checkpoint_shapes(ckpt.pretrained)
    if mine != shapes:
        missing = sorted(set(shapes) - set(mine))
        extra = sorted(set(mine) - set(shapes))
        reshaped = sorted(n for n in set(mine) & set(shapes) if mine[n] != shapes[n])
        parts = [
            f"{label} {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
            for label, names in (("missing", missing), ("extra", extra), ("other shape", reshaped))
            if names
        ]
        raise TrainerRunError(
            f"{ckpt.pretrained.path}: its weights are not the tensors of {last.name} (w*): "
            f"{'; '.join(parts)}"
        )


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)

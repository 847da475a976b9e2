"""A training run as a tracker exports it, and the parameters a plan needs from it.

A :class:`RunRecord` is one run: its id, its parameters as text (the tracker's form) and its
evaluation-loss history as ``(step, loss)`` pairs. :class:`ParamNames` says which parameter
names hold the batch size, the dataset size and the learning rate (defaults: the names the
common trainers log); :func:`resolve_run` reads them, or says which is missing.

Torch-free and dependency-free: the client package imports it without numpy or MLflow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

#: Every role a parameter name can be mapped to (``--param ROLE=NAME``), with the names tried
#: when the role is not mapped, first found wins.
DEFAULT_PARAM_NAMES: dict[str, tuple[str, ...]] = {
    # the batch of one optimizer step, in examples (all devices, all accumulation steps)
    "batch_size": (
        "batch_size",
        "global_batch_size",
        "total_batch_size",
        "train_batch_size",
        "total_train_batch_size",
    ),
    # otherwise: per-device batch × devices × gradient accumulation steps
    "per_device_batch_size": (
        "per_device_train_batch_size",
        "per_device_batch_size",
        "micro_batch_size",
    ),
    "devices": ("world_size", "n_gpu", "num_devices", "num_gpus", "devices"),
    "gradient_accumulation_steps": (
        "gradient_accumulation_steps",
        "grad_accum_steps",
        "accumulate_grad_batches",
    ),
    # the training-set size: examples, else tokens (converted with tokens_per_example)
    "examples": (
        "examples",
        "train_samples",
        "num_train_samples",
        "max_train_samples",
        "train_examples",
        "num_train_examples",
        "n_train",
        "train_size",
        "dataset_size",
        "data_size",
        "max_examples",
    ),
    "tokens": ("tokens", "train_tokens", "num_train_tokens", "dataset_tokens", "total_tokens"),
    "tokens_per_example": ("tokens_per_example",),
    "lr": ("learning_rate", "lr", "peak_lr", "max_lr"),
}
ROLES = tuple(DEFAULT_PARAM_NAMES)


class RunsInputError(ValueError):
    """Input the import cannot use at all (an unreadable export, an unknown mapping role, no
    usable run): the message names what is missing."""


@dataclass(frozen=True)
class ParamNames:
    """Which parameter names hold which role: ``mapped`` (``--param ROLE=NAME``) replaces the
    defaults of that role by the one name given; ``devices`` (``--devices N``) overrides any
    device-count parameter."""

    mapped: Mapping[str, str] = field(default_factory=dict)
    devices: int | None = None
    tokens_per_example: float | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.mapped) - set(ROLES))
        if unknown:
            raise RunsInputError(
                f"unknown parameter role(s) {unknown}: the roles are {', '.join(ROLES)}"
            )
        if self.devices is not None and self.devices < 1:
            raise RunsInputError(f"devices must be at least 1, got {self.devices}")
        tpe = self.tokens_per_example
        if tpe is not None and not (math.isfinite(tpe) and tpe > 0):
            raise RunsInputError(f"tokens per example must be positive, got {tpe}")

    def names(self, role: str) -> tuple[str, ...]:
        """The parameter names tried for ``role``, in order."""
        if role in self.mapped:
            return (self.mapped[role],)
        return DEFAULT_PARAM_NAMES[role]

    def with_mapping(self, pairs: Mapping[str, str]) -> ParamNames:
        return replace(self, mapped={**self.mapped, **pairs})


@dataclass(frozen=True)
class RunRecord:
    """One run: ``history`` holds its evaluation losses as ``(step, loss)`` sorted by step
    (one value per step); ``finished`` is False for a run the tracker reports as running,
    failed or killed (its last loss is not the end of its schedule)."""

    run: str
    params: Mapping[str, str]
    history: Sequence[tuple[float, float]]
    name: str | None = None
    status: str | None = None
    finished: bool = True
    history_note: str | None = None  # why the history is empty (e.g. the metric names tried)


@dataclass(frozen=True)
class ResolvedRun:
    """The numbers a plan needs from one run, or why each is missing.

    ``batch_size`` in examples; ``data_examples`` the training-set size in examples (tokens
    converted with the tokens per example), ``data_tokens`` in tokens (given as tokens, or
    examples × the tokens per example when those are known)."""

    record: RunRecord
    batch_size: int | None
    batch_note: str | None  # how the batch was read, or why it is missing
    data_examples: float | None
    data_tokens: float | None
    data_note: str | None
    lr: float | None

    @property
    def label(self) -> str:
        r = self.record
        return f"{r.run} ({r.name})" if r.name and r.name != r.run else r.run


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _lookup(
    params: Mapping[str, str], names: ParamNames, role: str
) -> tuple[str | None, float | None, str | None]:
    """(name found, its value, a problem): the first of the role's names the run has. A name
    present with a non-number is a problem, not a miss (a typo should not fall through)."""
    for key in names.names(role):
        if key in params:
            value = _number(params[key])
            if value is None:
                return key, None, f"param {key}={params[key]!r} is not a number"
            return key, value, None
    return None, None, None


def _tried(names: ParamNames, role: str) -> str:
    return ", ".join(names.names(role))


def _resolve_batch(params: Mapping[str, str], names: ParamNames) -> tuple[int | None, str]:
    key, value, problem = _lookup(params, names, "batch_size")
    if problem:
        return None, problem
    if key is None:
        key_pd, per_device, problem = _lookup(params, names, "per_device_batch_size")
        if problem:
            return None, problem
        if key_pd is None:
            return None, (
                f"no batch-size param (tried {_tried(names, 'batch_size')}; and "
                f"{_tried(names, 'per_device_batch_size')} × devices); map yours with "
                "--param batch_size=NAME"
            )
        devices: float | None = names.devices
        how = "--devices"
        if devices is None:
            key_dev, devices, problem = _lookup(params, names, "devices")
            if problem:
                return None, f"{problem}: give --devices N"
            if key_dev is None:
                return None, (
                    f"param {key_pd}={params[key_pd]} is per device, and the number of devices "
                    f"is unknown (tried {_tried(names, 'devices')}): give --devices N"
                )
            how = key_dev
        key_acc, accum, problem = _lookup(params, names, "gradient_accumulation_steps")
        if problem:
            return None, problem
        assert per_device is not None and devices is not None
        value = per_device * devices * (accum if accum is not None else 1.0)
        key = f"{key_pd}×{how}" + (f"×{key_acc}" if key_acc else "")
    assert value is not None
    if value < 1 or not float(value).is_integer():
        return None, f"batch size {value:g} ({key}) is not a positive whole number of examples"
    return int(value), key


def _tokens_per_example(
    params: Mapping[str, str], names: ParamNames
) -> tuple[float | None, str | None]:
    """(the tokens per example: ``--tokens-per-example``, else the run's param; a problem
    with the param). (None, None): unknown."""
    if names.tokens_per_example is not None:
        return names.tokens_per_example, None
    _, tpe, problem = _lookup(params, names, "tokens_per_example")
    if problem:
        return None, problem
    return (tpe, None) if tpe is not None and tpe > 0 else (None, None)


def _resolve_data(
    params: Mapping[str, str], names: ParamNames
) -> tuple[float | None, float | None, str]:
    """(examples, tokens, how they were read or why missing): the training-set size in
    examples (tokens ÷ tokens per example when given in tokens) and in tokens (the tokens
    param, else examples × tokens per example when those are known)."""
    key, examples, problem = _lookup(params, names, "examples")
    if problem:
        return None, None, problem
    if key is not None:
        assert examples is not None
        if examples <= 0:
            return None, None, f"param {key}={examples:g} is not a positive dataset size"
        _, tokens, _ = _lookup(params, names, "tokens")  # a run may log both
        if tokens is None or tokens <= 0:
            tpe, _ = _tokens_per_example(params, names)
            tokens = None if tpe is None else examples * tpe
        return examples, tokens, key
    key_tok, tokens, problem = _lookup(params, names, "tokens")
    if problem:
        return None, None, problem
    if key_tok is None:
        return (
            None,
            None,
            (
                f"no dataset-size param (tried {_tried(names, 'examples')}; "
                f"{_tried(names, 'tokens')}); map yours with --param examples=NAME or "
                "--param tokens=NAME"
            ),
        )
    assert tokens is not None
    if tokens <= 0:
        return None, None, f"param {key_tok}={tokens:g} is not a positive dataset size"
    tpe, problem = _tokens_per_example(params, names)
    if problem:
        return None, tokens, problem
    if tpe is None:
        return (
            None,
            tokens,
            (
                f"the dataset size is in tokens ({key_tok}={tokens:g}) and the tokens per example "
                "are unknown: give --tokens-per-example N (loss_vs_data is in examples)"
            ),
        )
    return tokens / tpe, tokens, key_tok


def resolve_run(record: RunRecord, names: ParamNames) -> ResolvedRun:
    """Read the batch size (examples per optimizer step), the training-set size and the
    learning rate of ``record`` under the mapping ``names``."""
    batch, batch_note = _resolve_batch(record.params, names)
    examples, tokens, data_note = _resolve_data(record.params, names)
    _, lr, _ = _lookup(record.params, names, "lr")
    return ResolvedRun(record, batch, batch_note, examples, tokens, data_note, lr)

"""The engine's result in the process: the public result models, cleaned for JSON.

Each stage of :func:`curvplan_worker.curvature.analyze.measure` builds its section of
:class:`curvplan.types.results.EngineMeasurements` directly (the models a client reads back:
one set, declared once, with the bulky arrays marked on their fields). What stays here is
worker-only: :func:`clean` (tensors and NaN/inf out of what a stage measured, before it becomes
a record), :func:`as_result` (the result JSON of the engine contract: the keys a stage wrote,
a stage that did not run leaving its key out) and :func:`fully_set`.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from pydantic import BaseModel, JsonValue

JsonObject = dict[str, JsonValue]
"""A JSON object as it travels between processes (a record read back before validation)."""

M = TypeVar("M", bound=BaseModel)


def as_result(record: BaseModel) -> dict[str, JsonValue]:
    """``record`` as the engine contract's JSON: the fields a stage set (those of the open
    sections it did not name included), NaN/inf as null, tensors and tuples as lists."""
    result: dict[str, JsonValue] = clean(record.model_dump(exclude_unset=True))
    return result


def fully_set(model: M) -> M:
    """A copy of ``model`` with every field marked set, nested models too (no validation):
    :func:`as_result` then writes all of its fields, as its own ``model_dump`` would, although
    the result leaves out the stages that did not run."""
    copy = model.model_copy()
    for name in type(model).model_fields:
        value = getattr(copy, name)
        if isinstance(value, BaseModel):
            object.__setattr__(copy, name, fully_set(value))
    object.__setattr__(copy, "__pydantic_fields_set__", set(type(model).model_fields))
    return copy


def clean(value: Any) -> Any:
    """JSON-safe: NaN/inf → None, tensors → lists, tuples → lists."""
    import torch

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, torch.Tensor):
        return clean(value.tolist())
    return value

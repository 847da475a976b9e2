"""JSON as the code that only reads it sees it.

:data:`pydantic.JsonValue` is the type of a JSON value a model field holds; its containers
are ``list`` and ``dict``, so a ``dict[str, int]`` is not one (``dict`` is invariant).
:data:`ReadJson` is the same JSON with read-only containers (``Mapping``, ``Sequence``),
which every JSON-shaped value is: what a function that serializes or inspects JSON takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

#: A JSON value whose containers are only read.
ReadJson: TypeAlias = (
    Mapping[str, "ReadJson"] | Sequence["ReadJson"] | str | int | float | bool | None
)

"""What PostgreSQL can store: text without NUL, valid UTF-8 (no lone surrogates).

JSON can carry both (``"\\u0000"``, ``"\\ud800"``) and Python decodes them happily, but
``text`` and ``jsonb`` refuse U+0000 and psycopg cannot encode a lone surrogate: a value
that reaches the database with either is a 500. Check client text with these first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def storable_text(value: str) -> bool:
    """Whether PostgreSQL text/jsonb can hold ``value``."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unstorable_paths(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Where a JSON-like value holds unstorable text (keys or strings), as paths."""
    if isinstance(value, str):
        if not storable_text(value):
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and not storable_text(key):
                yield (*path, shown(key))
            yield from unstorable_paths(item, (*path, shown(key) if isinstance(key, str) else key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from unstorable_paths(item, (*path, index))


def shown(value: str) -> str:
    """``value`` printable in a JSON answer: NUL and lone surrogates as escapes."""
    return value.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")

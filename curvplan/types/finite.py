"""Finite numbers only: where a JSON document holds NaN, ±Infinity or a number beyond a double.

JSON (RFC 8259 §6) has no NaN or Infinity, yet Python's parsers (``json``, pydantic's) accept
the tokens ``NaN``, ``Infinity`` and ``-Infinity`` and read ``1e999`` as ``inf``. Such a value
then passes a ``gt=0`` bound, breaks arithmetic in the planner or the worker, and PostgreSQL's
``jsonb`` refuses to store it. One rule for every body: the API refuses them before any route
reads the body (``curvplan_server.middleware.FiniteNumbersMiddleware``), each one a 422 naming
its field; the client checks what it is about to send with the same functions.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

Location = tuple[str | int, ...]

#: What a 422 says about such a number (the error's ``type`` is :data:`NON_FINITE_TYPE`).
NON_FINITE_MESSAGE = (
    "must be a finite number: JSON has no NaN or Infinity, and this number is beyond the "
    "range of a double (about 1.8e308)"
)
NON_FINITE_TYPE = "finite_number"

#: A document without any of these holds only finite numbers: the tokens NaN/Infinity, an
#: exponent of three or more digits, or 309 digits in a row (a mantissa ≥ 1e308). Anything
#: else that matches (a long digit string inside a text, 1e-300) is only walked, never refused.
_MAYBE_NON_FINITE = re.compile(rb"NaN|Infinity|[eE]\+?0*[1-9][0-9]{2}|[0-9]{309}")


def non_finite_paths(value: Any, loc: Location = ()) -> Iterator[Location]:
    """Where a parsed JSON value (dicts, lists, numbers, texts) holds a non-finite float."""
    if isinstance(value, float):
        if not math.isfinite(value):
            yield loc
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from non_finite_paths(item, (*loc, str(key)))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from non_finite_paths(item, (*loc, index))


def non_finite_in_json(raw: bytes | str, prefix: Location = ()) -> list[Location]:
    """Where a JSON document holds NaN, ±Infinity or a number no double holds (``1e999``).

    A document that is not JSON gives ``[]`` (whoever parses it next says why it is not).
    Cheap for the usual body: a regular-expression scan; only a document that might hold one
    is parsed and walked.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if _MAYBE_NON_FINITE.search(data) is None:
        return []
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        return []
    return list(non_finite_paths(parsed, prefix))

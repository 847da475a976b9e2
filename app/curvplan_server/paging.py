"""Opaque page tokens: base64url JSON objects, decoded defensively.

A page token comes back from the client, so it is untrusted input: anything but the
object we issued — nested JSON, a number where a string belongs, a NUL or a lone
surrogate that PostgreSQL cannot store, a naive time — is a 422 naming
``query.page_token``, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from curvplan_core.storable import storable_text
from curvplan_server.problems import Problem, validation_problem

MAX_PAGE_TOKEN_CHARS = 2048  # ours are a few hundred; a longer one is not ours


def page_token_problem(message: str = "invalid page token") -> Problem:
    """The 422 of a bad ``page_token`` query parameter."""
    loc: list[str | int] = ["query", "page_token"]
    return validation_problem(
        [{"field": "query.page_token", "loc": loc, "message": message, "type": "value_error"}]
    )


def encode_page_token(fields: dict[str, str]) -> str:
    """The token of ``fields`` (string values only)."""
    blob = json.dumps(fields, separators=(",", ":"))
    return base64.urlsafe_b64encode(blob.encode()).decode().rstrip("=")


def decode_page_token(token: str, keys: tuple[str, ...]) -> dict[str, str]:
    """The string fields ``keys`` of a token we issued; a 422 problem for anything else."""
    if len(token) > MAX_PAGE_TOKEN_CHARS:
        raise page_token_problem()
    try:
        padded = token + "=" * (-len(token) % 4)
        data: Any = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, binascii.Error, RecursionError):  # UnicodeDecodeError is a ValueError
        raise page_token_problem() from None
    if not isinstance(data, dict):
        raise page_token_problem()
    out: dict[str, str] = {}
    for key in keys:
        value = data.get(key)
        if not isinstance(value, str) or not storable_text(value):
            raise page_token_problem()
        out[key] = value
    return out

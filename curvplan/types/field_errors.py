"""A validation error that names its field, raised from a model-level check.

A ``model_validator`` that raises ``ValueError`` is reported at the model itself
(``body.sweep``); a rule that involves several fields still blames one, so that the 422
names it (``body.sweep.window_tokens``).
"""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError


def field_error(
    model: str, loc: tuple[str | int, ...], message: str, error_type: str
) -> ValidationError:
    """A ``ValidationError`` of ``model`` at ``loc`` (relative to the model) with ``message``."""
    details: list[InitErrorDetails] = [
        {"type": PydanticCustomError(error_type, message), "loc": loc, "input": None}
    ]
    return ValidationError.from_exception_data(model, details)

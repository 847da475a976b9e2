"""Cooperative cancellation inside the engine's loops.

``analyze`` installs the caller's ``should_cancel`` for the duration of a run with
:func:`cancel_scope`; the long loops (each Lanczos step, each Hutch++ product, each per-sample
evaluation, each gradient-noise micro-batch) call :func:`check_cancel`, which raises
:class:`Cancelled` once ``should_cancel()`` returns True. So a run stops within one operator
product of the request instead of at the next block boundary. Outside a scope (the engine
used as a library) :func:`check_cancel` costs one context-variable read and never raises.

The check is a context variable rather than a parameter of every numerical routine so that the
routines keep their signatures (and their callers need not pass it through every layer).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

ShouldCancel = Callable[[], bool]

_SHOULD_CANCEL: contextvars.ContextVar[ShouldCancel | None] = contextvars.ContextVar(
    "curvplan_should_cancel", default=None
)


class Cancelled(Exception):
    """The caller asked to stop (``should_cancel()`` returned True)."""


@contextlib.contextmanager
def cancel_scope(should_cancel: ShouldCancel | None) -> Iterator[None]:
    """Make :func:`check_cancel` consult ``should_cancel`` inside the ``with`` block."""
    token = _SHOULD_CANCEL.set(should_cancel)
    try:
        yield
    finally:
        _SHOULD_CANCEL.reset(token)


def check_cancel(where: str = "") -> None:
    """Raise :class:`Cancelled` if the current scope's ``should_cancel()`` says so."""
    should_cancel = _SHOULD_CANCEL.get()
    if should_cancel is not None and should_cancel():
        raise Cancelled(f"cancelled during {where}" if where else "cancelled")

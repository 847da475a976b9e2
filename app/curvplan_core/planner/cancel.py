"""Cooperative cancellation inside the planner's loops (the worker's ``plan`` kind).

The caller installs ``should_stop`` with :func:`cancel_scope`; the loops over orderings call
the check :func:`stop_check` returns (captured before any thread pool, since threads do not
inherit context variables), which raises :class:`PlanCancelled` once ``should_stop()`` is
True. Outside a scope (the planner as a library) the check never raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

ShouldStop = Callable[[], bool]

_SHOULD_STOP: ContextVar[ShouldStop | None] = ContextVar("curvplan_plan_should_stop", default=None)


class PlanCancelled(Exception):
    """The caller asked the planner to stop."""


@contextmanager
def cancel_scope(should_stop: ShouldStop | None) -> Iterator[None]:
    """Make :func:`stop_check` consult ``should_stop`` inside the ``with`` block."""
    token = _SHOULD_STOP.set(should_stop)
    try:
        yield
    finally:
        _SHOULD_STOP.reset(token)


def _never() -> None:
    return None


def stop_check() -> Callable[[], None]:
    """A function that raises :class:`PlanCancelled` when the current scope's caller asked to
    stop (a no-op outside any scope); call it from loops, also from pool threads."""
    should_stop = _SHOULD_STOP.get()
    if should_stop is None:
        return _never

    def check() -> None:
        if should_stop():
            raise PlanCancelled()

    return check

"""Structured logging on the standard library: JSON in production, readable locally.

Usage::

    configure_logging("json")            # once per process
    log = logging.getLogger(__name__)
    with bind(job_id=str(job.id), attempt=job.attempt, worker_id=worker_id):
        log.info("claimed")              # carries job_id, attempt, worker_id

Context is kept in a :class:`contextvars.ContextVar`, so it follows threads started
with ``contextvars.copy_context().run`` and asyncio tasks, and nested ``bind``
calls stack and unwind.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal

_context: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "curvplan_log_context", default=None
)

# Attributes every LogRecord has; anything else was passed through ``extra=``.
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured duplicate of the message
}


def current_context() -> dict[str, object]:
    """The fields bound in the current context (a copy)."""
    return dict(_context.get() or {})


@contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Attach ``fields`` to every log record emitted inside the ``with`` block."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


class ContextFilter(logging.Filter):
    """Copy the bound context onto each record (without overwriting explicit extras)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def _extra_fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, bound fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {  # any object: json.dumps writes others with str()
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update(_extra_fields(record))
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class ConsoleFormatter(logging.Formatter):
    """``HH:MM:SS level logger: message key=value …`` for humans."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extra_fields(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in sorted(extras.items()))
        return line


def configure_logging(
    format: Literal["json", "console"] = "console", level: str | int = "INFO"
) -> None:
    """Install one stderr handler on the root logger with the chosen format (idempotent)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_curvplan", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._curvplan = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonFormatter() if format == "json" else ConsoleFormatter())
    handler.addFilter(ContextFilter())
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    # Alembic announces its autogenerate plugins at INFO on import: noise for a service.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    # uvicorn installs its own handlers; route its records through ours instead.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True

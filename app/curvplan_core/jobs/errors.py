"""The ``job.error`` object that the queue itself writes (worker lost, empty fan-out, …)."""

from __future__ import annotations

from curvplan_core.jobs.records import ErrorRecord


def error_dict(type: str, title: str | None, detail: str | None) -> ErrorRecord:
    """A ``job.error`` object built by the worker itself (worker-lost, internal-error, …)."""
    return {"type": type, "title": title, "detail": detail}

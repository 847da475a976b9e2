"""The ``job.error`` object that the queue itself writes (worker lost, empty fan-out, …)."""

from __future__ import annotations


def error_dict(type: str, title: str, detail: str) -> dict[str, str]:
    """A ``job.error`` object built by the worker itself (worker-lost, internal-error, …)."""
    return {"type": type, "title": title, "detail": detail}

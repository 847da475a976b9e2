"""Assertions shared by the API tests (a uniquely named module: tests have no packages)."""

from __future__ import annotations

import threading
from typing import Any


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    """The response is an RFC 9457 problem with ``status``; return its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert "Traceback" not in response.text
    return body


def error_fields(problem: dict[str, Any]) -> set[str]:
    """The dotted field names a 422 problem reports."""
    return {e["field"] for e in problem.get("errors") or []}


class JobReads:
    """Tells when the API next reads a job: a long-poll reads the status it then waits to see
    change, so a writer that waits for that read changes it while the request waits, however
    late the loaded machine starts the request (a change before the read is no change to it:
    the request would wait its whole ``wait``)."""

    def __init__(self, monkeypatch: Any) -> None:
        from curvplan_server.jobs import router

        self._real = router._read_job
        self._lock = threading.Lock()
        self._armed: list[threading.Event] = []
        monkeypatch.setattr(router, "_read_job", self._read)

    def _read(self, *args: Any) -> Any:
        job = self._real(*args)
        with self._lock:
            for event in self._armed:
                event.set()
            self._armed.clear()
        return job

    def next_read(self) -> threading.Event:
        """An event set once the API's next read of a job has returned."""
        event = threading.Event()
        with self._lock:
            self._armed.append(event)
        return event

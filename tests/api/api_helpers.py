"""Assertions shared by the API tests (a uniquely named module: tests have no packages)."""

from __future__ import annotations

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

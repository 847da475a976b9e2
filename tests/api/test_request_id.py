"""X-Request-ID: on every answer (401, 404, 500 included), taken from the request when given
(sanitised, bounded), and on every log line of the request (also from a worker thread)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.concurrency import run_in_threadpool
from fastapi.testclient import TestClient

from curvplan_core.logging import ContextFilter
from curvplan_server.request_id import MAX_REQUEST_ID_LENGTH

log = logging.getLogger("curvplan.test.request_id")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(ContextFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[_Records]:
    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


@pytest.fixture
def traced_client(app: Any) -> Iterator[TestClient]:
    async def logs() -> dict[str, str]:
        log.warning("in the handler")
        await run_in_threadpool(log.warning, "in a worker thread")
        return {}

    async def boom() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/v1/_test/logs", logs)
    app.add_api_route("/v1/_test/boom", boom)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def test_every_answer_has_a_request_id(traced_client: TestClient) -> None:
    answers = [
        traced_client.get("/healthz"),
        traced_client.get("/v1/jobs"),  # 401: no key
        traced_client.get("/nowhere"),  # 404
        traced_client.get("/v1/_test/boom"),  # 500
    ]
    assert [a.status_code for a in answers] == [200, 401, 404, 500]
    ids = [a.headers["x-request-id"] for a in answers]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == 4
    assert all(len(a.headers.get_list("x-request-id")) == 1 for a in answers)


def test_a_given_request_id_is_kept_sanitised_and_bounded(traced_client: TestClient) -> None:
    given = traced_client.get("/healthz", headers={"X-Request-ID": "ci-run-42/step:7"})
    assert given.headers["x-request-id"] == "ci-run-42/step:7"
    hostile = 'a b"c;<d>' + "x" * 10_000
    cleaned = traced_client.get("/healthz", headers={"X-Request-ID": hostile})
    assert cleaned.headers["x-request-id"] == ("abcd" + "x" * 10_000)[:MAX_REQUEST_ID_LENGTH]
    nothing_left = traced_client.get("/healthz", headers={"X-Request-ID": '  ";'})
    assert re.fullmatch(r"[0-9a-f]{32}", nothing_left.headers["x-request-id"])


def test_every_log_line_of_a_request_carries_its_id(
    traced_client: TestClient, records: _Records
) -> None:
    ok = traced_client.get("/v1/_test/logs", headers={"X-Request-ID": "trace-1"})
    failed = traced_client.get("/v1/_test/boom", headers={"X-Request-ID": "trace-2"})
    assert ok.headers["x-request-id"] == "trace-1" and failed.status_code == 500
    by_message = {r.getMessage(): getattr(r, "request_id", None) for r in records.records}
    assert by_message["in the handler"] == "trace-1"
    assert by_message["in a worker thread"] == "trace-1"
    (unhandled,) = [r for r in records.records if r.getMessage().startswith("unhandled error")]
    assert getattr(unhandled, "request_id", None) == "trace-2"
    log.warning("outside any request")
    assert not hasattr(records.records[-1], "request_id")

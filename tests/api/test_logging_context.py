"""curvplan_core.logging: JSON/console formats and the bound context (job, attempt, worker)."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from curvplan_core.logging import (
    ConsoleFormatter,
    ContextFilter,
    JsonFormatter,
    bind,
    current_context,
)


@pytest.fixture
def capture():  # type: ignore[no-untyped-def]
    def make(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        handler.addFilter(ContextFilter())
        logger = logging.getLogger(f"test.logging.{id(stream)}")
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(logging.INFO)
        return logger, stream

    return make


def test_json_lines_carry_bound_fields_and_extras(capture) -> None:
    log, stream = capture(JsonFormatter())
    with bind(job_id="j-1", attempt=2, worker_id="w-9"):
        log.info("claimed %s", "job", extra={"queue": "cpu"})
        with bind(attempt=3):
            log.warning("retry")
        log.info("after")
    log.info("unbound")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["message"] == "claimed job" and lines[0]["level"] == "info"
    expected = {"job_id": "j-1", "attempt": 2, "worker_id": "w-9", "queue": "cpu"}
    assert expected.items() <= lines[0].items()
    assert lines[1]["attempt"] == 3 and lines[1]["job_id"] == "j-1"
    assert lines[2]["attempt"] == 2
    assert "job_id" not in lines[3]
    assert current_context() == {}


def test_exception_goes_into_the_json_line(capture) -> None:
    log, stream = capture(JsonFormatter())
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("failed")
    line = json.loads(stream.getvalue())
    assert "ValueError: bad" in line["exception"]


def test_console_format_is_readable(capture) -> None:
    log, stream = capture(ConsoleFormatter())
    with bind(job_id="j-2"):
        log.info("hello")
    text = stream.getvalue()
    assert "INFO" in text and "hello" in text and "job_id=j-2" in text


def test_context_does_not_leak_between_threads(capture) -> None:
    log, stream = capture(JsonFormatter())
    ready = threading.Event()

    def other() -> None:
        ready.wait()
        log.info("other thread")

    thread = threading.Thread(target=other)
    thread.start()
    with bind(job_id="main-only"):
        ready.set()
        thread.join()
    record = json.loads(stream.getvalue())
    assert "job_id" not in record

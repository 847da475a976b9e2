"""A failed heartbeat is logged with the job id and attempt it was renewing (and the
worker id), so an operator can tell which attempt's lease is at risk."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from curvplan_core.jobs import store
from curvplan_core.logging import ContextFilter, JsonFormatter, bind
from curvplan_worker.worker import WorkerOptions, WorkerSlot, _Current


class _DownEngine:
    """An engine whose every transaction fails, like a database that went away."""

    def begin(self) -> Any:
        raise ConnectionError("database unreachable")


def test_heartbeat_failure_names_the_running_job(tmp_path: Path) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    logger = logging.getLogger("curvplan.worker")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    options = WorkerOptions(
        database_url="postgresql+psycopg://unused/none",
        queues=("cpu",),
        data_dir=tmp_path,
        lease_seconds=1.0,
        heartbeat_seconds=0.05,
    )
    slot = WorkerSlot(options, _DownEngine(), None, threading.Event(), threading.Event(), "w-7")  # type: ignore[arg-type]
    fence = store.Fence(job_id=uuid.uuid4(), worker_id="w-7", attempt=2)
    slot.state.current = _Current(fence=fence)
    try:
        with bind(worker_id="w-7"):  # what WorkerSlot.run binds before starting the thread
            beat = threading.Thread(
                target=contextvars.copy_context().run, args=(slot._heartbeat_loop,)
            )
        beat.start()
        try:
            for _ in range(200):  # the first beat fails at once; allow 10 s on a busy box
                if "heartbeat failed" in stream.getvalue():
                    break
                time.sleep(0.05)
        finally:
            slot._heartbeat_done.set()
            slot.state.beat_now.set()
            beat.join(5)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    failed = [r for r in records if r["message"].startswith("heartbeat failed")]
    assert failed, records
    assert failed[0]["job_id"] == str(fence.job_id)
    assert failed[0]["attempt"] == 2
    assert failed[0]["worker_id"] == "w-7"
    assert "database unreachable" in failed[0]["message"]

"""A failed heartbeat is logged with the job id and attempt it was renewing (and the
worker id), so an operator can tell which attempt's lease is at risk."""

from __future__ import annotations

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
from curvplan_worker.attempt_state import CurrentAttempt, SlotState
from curvplan_worker.heartbeat import Heartbeat
from curvplan_worker.options import WorkerOptions


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
    state = SlotState()
    heartbeat = Heartbeat(options, _DownEngine(), "w-7", state, threading.Event())  # type: ignore[arg-type]
    fence = store.Fence(job_id=uuid.uuid4(), worker_id="w-7", attempt=2)
    state.current = CurrentAttempt(fence=fence)
    try:
        with bind(worker_id="w-7"):  # what WorkerSlot.run binds before starting the thread
            heartbeat.start()
        try:
            for _ in range(200):  # the first beat fails at once; allow 10 s on a busy box
                if "heartbeat failed" in stream.getvalue():
                    break
                time.sleep(0.05)
        finally:
            heartbeat.finish(timeout=5)
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

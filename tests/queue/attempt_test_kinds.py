"""A job kind for the attempt-process tests: ``request.behaviour`` picks what it does.

Registered only inside the test process (``monkeypatch.setitem(KINDS, …)``) and run
in children started with the ``fork`` context, which inherit that registration.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict

from curvplan_worker.errors import JobError, RetryableError
from curvplan_worker.job_context import JobContext


class AttemptRequest(BaseModel):
    """The test kind's request (its create model): what to do, and for how long."""

    model_config = ConfigDict(extra="forbid")

    kind: str = "test"
    behaviour: str
    seconds: float = 0.0


class AttemptResult(BaseModel):
    """The test kind's result model: whatever the behaviour reports."""

    model_config = ConfigDict(extra="allow")


def run(request: AttemptRequest, ctx: JobContext) -> AttemptResult | dict[str, Any]:
    return _behave(request, ctx)


def _behave(request: AttemptRequest, ctx: JobContext) -> Any:
    behaviour = request.behaviour
    if behaviour == "progress":
        for i in range(3):
            ctx.report_progress(i / 2, f"stage-{i}", f"step {i}")
        return AttemptResult.model_validate(
            {"job_id": ctx.job_id, "attempt": ctx.attempt, "data_dir": str(ctx.data_dir)}
        )
    if behaviour == "cooperative":  # reports progress often, so it sees cancel quickly
        deadline = time.monotonic() + request.seconds
        steps = 0
        while time.monotonic() < deadline:
            ctx.report_progress(0.5, "loop", f"step {steps}")
            steps += 1
            time.sleep(0.01)
        return AttemptResult.model_validate({"steps": steps})
    if behaviour == "sleep":  # never reports progress: cancel cannot reach it
        time.sleep(request.seconds)
        return AttemptResult.model_validate({"slept": request.seconds})
    if behaviour == "exit":
        os._exit(3)
    if behaviour == "segfault":
        faulthandler.disable()  # pytest's handler (inherited by fork) would dump to the log
        ctypes.string_at(0)
    if behaviour == "job-error":
        raise JobError("invalid-request", "Invalid request", "measurements.x: bad")
    if behaviour == "exception":
        raise RuntimeError("boom " * 200)
    if behaviour == "not-json":
        return AttemptResult.model_validate({"value": float("nan")})
    if behaviour == "transient":
        raise RetryableError("download of blob 00ff failed: ConnectError")
    if behaviour == "api":  # what a remote worker's child sees of the API
        return AttemptResult.model_validate(
            {"api_url": ctx.api_url, "key_sha256": _sha256(ctx.api_key)}
        )
    if behaviour == "not-the-result-model":  # a dict, as kinds returned before
        return {"value": 1}
    if behaviour == "bad-progress":
        ctx.report_progress(1.5, "oops")
    raise AssertionError(f"unknown behaviour {behaviour}")


def _sha256(value: str | None) -> str | None:
    import hashlib

    return None if value is None else hashlib.sha256(value.encode()).hexdigest()

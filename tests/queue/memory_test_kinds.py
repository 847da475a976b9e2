"""A job kind for the memory-limit tests: it allocates ``request.bytes`` (times the attempt's
micro-batch factor, as an analysis would halve its micro-batch) and holds it.

Registered only inside the test process (``monkeypatch.setitem(KINDS, …)``) and run in
children started with the ``fork`` context, which inherit that registration.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from curvplan_worker.job_context import JobContext

CHUNK = 16 * 2**20


class MemoryRequest(BaseModel):
    """The memtest kind's request (its create model)."""

    model_config = ConfigDict(extra="forbid")

    kind: str = "memtest"
    bytes: int = 0
    hold_seconds: float = 0.0
    cgroup: str | None = None


class MemoryResult(BaseModel):
    """The memtest kind's result: the factor it ran with and the bytes it held."""

    factor: float
    held_bytes: int


def run(request: MemoryRequest, ctx: JobContext) -> MemoryResult:
    (ctx.data_dir / f"pid-{ctx.attempt}-{os.getpid()}").write_text(str(os.getpid()))
    factor = ctx.limits.micro_batch_factor if ctx.limits is not None else 1.0
    if request.cgroup:  # move into the test's cgroup, then let the worker see it there
        Path(request.cgroup, "cgroup.procs").write_text(str(os.getpid()))
        time.sleep(1.0)
    held = []
    wanted = int(request.bytes * factor)
    while len(held) * CHUNK < wanted:
        held.append(bytearray(b"\x01") * CHUNK)  # written, so resident
        time.sleep(0.01)
    time.sleep(request.hold_seconds)
    return MemoryResult(factor=factor, held_bytes=len(held) * CHUNK)

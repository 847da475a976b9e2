"""Run every runnable job of a database with one worker slot whose attempts are forked
children, counting each ``ModelSpec`` validation per process (tests/analyze/test_typed_request.py).

A fresh process: forking the test process itself, whose torch thread pools earlier tests have
started, can hang a child in its first parallel region; this process forks before any.

Usage: ``python typed_walk.py DATABASE_URL DATA_DIR COUNTS_DIR`` → prints the claimed kinds as
JSON.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
from pathlib import Path
from typing import Any

from curvplan.types.spec import ModelSpec


def counting_validator(counts: Path) -> Any:
    """A stand-in for ``ModelSpec.__pydantic_validator__`` that appends a line to
    ``<counts>/<pid>`` on every validation (``model_validate``, ``model_validate_json``, the
    constructor), in this process and in forked children, then validates as the real one."""
    real = ModelSpec.__pydantic_validator__

    class Counting:
        def _count(self) -> None:
            with (counts / str(os.getpid())).open("a") as out:
                out.write("1\n")

        def validate_python(self, *args: Any, **kwargs: Any) -> Any:
            self._count()
            return real.validate_python(*args, **kwargs)

        def validate_json(self, *args: Any, **kwargs: Any) -> Any:
            self._count()
            return real.validate_json(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    return Counting()


def run_queue(url: str, data_dir: Path) -> list[str]:
    """Claim and run every runnable job with one slot; the kinds it ran, in order."""
    from curvplan_core.db import make_engine
    from curvplan_core.jobs import lifecycle
    from curvplan_worker.claim_loop import WorkerSlot
    from curvplan_worker.options import WorkerOptions

    options = WorkerOptions(
        database_url=url,
        queues=("gpu", "cpu"),
        data_dir=data_dir,
        lease_seconds=60.0,
        heartbeat_seconds=5.0,
        log_format="json",
        log_level="WARNING",
    )
    engine = make_engine(url)
    fork = multiprocessing.get_context("fork")
    slot = WorkerSlot(options, engine, fork, threading.Event(), threading.Event(), "w-typed")
    kinds = []
    try:
        while True:
            with engine.begin() as conn:
                claimed = lifecycle.claim(conn, slot.worker_id, ["gpu", "cpu"], 60.0)
            if claimed is None:
                return kinds
            kinds.append(claimed.kind)
            slot.supervisor.run(claimed)
    finally:
        engine.dispose()


if __name__ == "__main__":
    database_url, data, counts_dir = sys.argv[1:4]
    ModelSpec.__pydantic_validator__ = counting_validator(Path(counts_dir))  # type: ignore[misc]
    print(json.dumps(run_queue(database_url, Path(data))))

"""A slot's heartbeat thread: renew the lease, write progress, read the cancel flag, keep the
``worker`` row fresh, and run the reaper every ``reaper_interval``.

A fenced heartbeat that matches no row marks the attempt's lease lost (its supervisor then
abandons it). A failed beat is logged with the job and attempt it was renewing.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import traceback
import uuid
from typing import Literal

from sqlalchemy import Engine

from curvplan_core.jobs import lifecycle, store
from curvplan_core.logging import bind
from curvplan_worker.attempt_state import SlotState
from curvplan_worker.health import touch_health_file
from curvplan_worker.metrics import WorkerMetrics
from curvplan_worker.options import WorkerOptions
from curvplan_worker.outcome import fail_parent_fast

log = logging.getLogger("curvplan.worker")


class Heartbeat:
    """Beats every ``heartbeat_seconds`` (at once when ``state.beat_now`` is set) until
    :meth:`finish`; reaps expired leases and stale workers every ``reaper_interval``."""

    def __init__(
        self,
        options: WorkerOptions,
        engine: Engine,
        worker_id: str,
        state: SlotState,
        stop: threading.Event,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.options = options
        self.engine = engine
        self.worker_id = worker_id
        self.state = state
        self.stop = stop
        self.metrics = metrics
        self.done = threading.Event()
        self._last_reap = 0.0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run :meth:`loop` in a thread that keeps the caller's bound log context."""
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self.loop,),
            name=f"heartbeat-{self.worker_id}",
            daemon=True,
        )
        self._thread.start()

    def finish(self, timeout: float = 10) -> None:
        """End the loop (its current beat completes) and wait for the thread."""
        self.done.set()
        self.state.beat_now.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def loop(self) -> None:
        while not self.done.is_set():
            try:
                self.beat()
                if self.metrics is not None:
                    self.metrics.beat(self.worker_id, True)
                if time.monotonic() - self._last_reap >= self.options.reaper_interval:
                    self.reap()
            except Exception:
                if self.metrics is not None:
                    self.metrics.beat(self.worker_id, False)
                # This thread only has the worker id bound; a failed beat concerns the
                # attempt running now, so its log line names that job and attempt too.
                with self.state.lock:
                    current = self.state.current
                job = (
                    {"job_id": str(current.fence.job_id), "attempt": current.fence.attempt}
                    if current is not None
                    else {}
                )
                with bind(**job):
                    log.error("heartbeat failed: %s", traceback.format_exc(limit=3))
            self.state.beat_now.wait(self.options.heartbeat_seconds)
            self.state.beat_now.clear()

    def beat(self) -> None:
        """One beat: the fenced lease renewal (with new progress) and the worker row."""
        with self.state.lock:
            current = self.state.current
            progress = current.progress if current else None
        status: Literal["running", "stopping"] = "stopping" if self.stop.is_set() else "running"
        with self.engine.begin() as conn:
            if current is not None and not current.lease_lost:
                changed = progress is not None and progress != current.progress_written
                seen = store.heartbeat(
                    conn,
                    current.fence,
                    self.options.lease_seconds,
                    current.progress_payload(progress) if changed else None,
                )
                with self.state.lock:
                    if seen is None:
                        current.lease_lost = True
                    else:
                        current.progress_written = progress
                        current.cancel_requested = seen.cancel_requested
            store.touch_worker(
                conn, self.worker_id, status, current.fence.job_id if current else None
            )
        if self.options.health_file is not None:  # after the commit: the beat reached the DB
            touch_health_file(self.options.health_file)

    def beat_if_running(self, job_id: str) -> None:
        """Beat now (not at the next period) if job ``job_id`` runs in this slot."""
        with self.state.lock:
            current = self.state.current
        if current is not None and str(current.fence.job_id) == job_id:
            self.state.beat_now.set()

    def reap(self) -> list[uuid.UUID]:
        """Recover expired leases and mark stale workers stopped; the reaped jobs' ids."""
        self._last_reap = time.monotonic()
        # Two transactions: the reaper locks job rows, the stale check worker rows;
        # holding both at once could deadlock with a revived worker's heartbeat.
        with self.engine.begin() as conn:
            reaped = lifecycle.requeue_expired(
                conn, backoff_base=self.options.backoff_base, backoff_max=self.options.backoff_max
            )
        with self.engine.begin() as conn:
            stale = store.mark_stale_workers(conn, self.options.worker_stale_seconds)
        for job in reaped:
            if job.status == "failed":
                fail_parent_fast(self.engine, job.job_id)
            log.warning(
                "reaped a job whose lease expired",
                extra={
                    "reaped_job_id": str(job.job_id),
                    "reaped_attempt": job.attempt,
                    "lost_worker_id": job.lost_worker_id,
                    "status": job.status,
                },
            )
        for worker_id in stale:
            log.warning(
                "marked a worker without heartbeat stopped", extra={"stale_worker": worker_id}
            )
        return [job.job_id for job in reaped]

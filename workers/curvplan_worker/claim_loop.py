"""A worker slot: register a ``worker`` row, claim jobs one at a time, hand each to the
attempt supervisor, and mark the row stopped at the end.

Idle, a slot waits on LISTEN/NOTIFY for a new job (or until the earliest backed-off job may
run, or the slow fallback); without notifications it polls every ``poll_interval``. Its
heartbeat thread (:mod:`curvplan_worker.heartbeat`) runs from registration to the end.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading

from sqlalchemy import Engine

from curvplan_core.credentials.service_keys import create_worker_key, worker_key_valid
from curvplan_core.jobs import lifecycle, store
from curvplan_core.logging import bind
from curvplan_core.notify import QueueNotifier
from curvplan_worker.attempt_state import SlotState
from curvplan_worker.heartbeat import Heartbeat
from curvplan_worker.metrics import WorkerMetrics
from curvplan_worker.options import WorkerOptions
from curvplan_worker.supervisor import AttemptSupervisor

log = logging.getLogger("curvplan.worker")


def new_worker_id() -> str:
    """``<hostname>-<pid>-<random4>``: unique across machines and restarts."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class WorkerSlot:
    """Claims and runs one job at a time; owns one ``worker`` row."""

    def __init__(
        self,
        options: WorkerOptions,
        engine: Engine,
        mp_context: object,
        stop: threading.Event,
        hurry: threading.Event,
        worker_id: str | None = None,
        notifier: QueueNotifier | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.options = options
        self.notifier = notifier
        self.engine = engine
        self.stop = stop
        self.worker_id = worker_id or new_worker_id()
        self.state = SlotState()
        self._api_key: str | None = None
        self.heartbeat = Heartbeat(options, engine, self.worker_id, self.state, stop, metrics)
        self.supervisor = AttemptSupervisor(
            options,
            engine,
            mp_context,
            self.state,
            stop,
            hurry,
            self.worker_id,
            self.worker_key,
            metrics,
        )

    def run(self) -> None:
        """Register, loop until stopped, mark the row stopped."""
        with bind(worker_id=self.worker_id):
            with self.engine.begin() as conn:
                store.register_worker(
                    conn,
                    self.worker_id,
                    socket.gethostname(),
                    os.getpid(),
                    list(self.options.queues),
                    self.options.devices,
                )
                if self.options.api_url:
                    self._api_key = create_worker_key(conn, self.worker_id)
            log.info("worker started", extra={"queues": ",".join(self.options.queues)})
            self.heartbeat.start()
            try:
                self._claim_loop()
            finally:
                self.heartbeat.finish(timeout=10)
                with self.engine.begin() as conn:
                    store.stop_worker(conn, self.worker_id)
                log.info("worker stopped")

    def _claim_loop(self) -> None:
        queues = list(self.options.queues)
        while not self.stop.is_set():
            notified = self.notifier is not None and self.notifier.connected
            seen = self.notifier.generation if self.notifier is not None else 0
            due: float | None = None
            try:
                with self.engine.begin() as conn:
                    job = lifecycle.claim(conn, self.worker_id, queues, self.options.lease_seconds)
                    if job is None and notified:
                        due = store.seconds_until_runnable(conn, queues)
            except Exception:
                log.exception("claim failed; retrying after the poll interval")
                self.stop.wait(self.options.poll_interval)
                continue
            if job is None:
                self._idle_wait(notified, seen, due)
                continue
            with bind(job_id=str(job.fence.job_id), attempt=job.fence.attempt):
                try:
                    self.supervisor.run(job)
                except Exception:
                    # E.g. the database went away before the outcome was written: the
                    # lease runs out and the reaper re-queues the job (or fails it).
                    log.exception("attempt supervision failed; the lease will expire")

    def _idle_wait(self, notified: bool, seen: int, due: float | None) -> None:
        """Nothing to claim: wait for a NOTIFY of a new job (or the next retry's time, or
        the slow fallback); without notifications, poll every ``poll_interval``."""
        if not notified or self.notifier is None:
            self.stop.wait(self.options.poll_interval)
            return
        timeout = self.options.notify_fallback_seconds
        if due is not None:
            timeout = min(timeout, max(due, 0.05))
        self.notifier.wait(seen, timeout)

    def beat_if_cancelling(self, job_id: str) -> None:
        """A NOTIFY said job ``job_id`` is ``cancelling``: if it runs here, beat now (the beat
        reads the flag and hands it to the child) instead of at the next period."""
        self.heartbeat.beat_if_running(job_id)

    def worker_key(self) -> str:
        """This slot's ``worker`` key, created again if the reaper revoked it (the slot was
        paused past the stale limit and came back)."""
        with self.engine.begin() as conn:
            if self._api_key is None or not worker_key_valid(conn, self._api_key):
                self._api_key = create_worker_key(conn, self.worker_id)
                log.info("created a new worker credential (the previous one was revoked)")
        return self._api_key

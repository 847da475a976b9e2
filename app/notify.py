"""Waiting without polling: PostgreSQL LISTEN/NOTIFY on job changes.

A trigger on ``job`` (migration ``0005``) runs ``pg_notify('curvplan_job', …)`` when a
job is inserted or its status changes, with ``<job id> <status> <queue>`` as payload.
Each API process holds **one** listening connection (:class:`JobNotifier`) and wakes
the long-polls (``GET /v1/jobs/{id}?wait=``) waiting on that job; each worker process
holds one too and wakes its idle slots when a job is queued on their queues.

Polling stays as a slow fallback: a waiter re-checks the database every
``fallback_seconds`` anyway, and after the listening connection is (re)established
every waiter is woken once, because notifications sent while it was down are lost.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Callable

import psycopg

from curvplan_server.config import libpq_url

log = logging.getLogger(__name__)

CHANNEL = "curvplan_job"


def parse_payload(payload: str) -> tuple[str, str, str] | None:
    """``(job_id, status, queue)`` of a notification payload, None if malformed."""
    parts = payload.split(" ")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


class Listener:
    """A thread that LISTENs on :data:`CHANNEL` and calls ``on_notify(payload)``.

    ``on_connect()`` is called each time the connection is (re)established, so that
    waiters can re-check what they may have missed. Reconnects with a 1 s pause.
    """

    def __init__(
        self,
        database_url: str,
        on_notify: Callable[[str], None],
        on_connect: Callable[[], None],
        name: str = "curvplan-listen",
    ) -> None:
        self.url = libpq_url(database_url)
        self.on_notify = on_notify
        self.on_connect = on_connect
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    self.on_connect()
                    while not self._stop.is_set():
                        for notify in conn.notifies(timeout=1.0):
                            self.on_notify(notify.payload)
            except Exception as exc:  # the database went away: fall back to polling, retry
                if self.connected.is_set():
                    log.warning("job notifications lost (%s); reconnecting", type(exc).__name__)
                self.connected.clear()
                self._stop.wait(1.0)
        self.connected.clear()


class JobNotifier:
    """Wakes asyncio waiters on a job id when that job changes (one per API process)."""

    def __init__(self, database_url: str) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._listener = Listener(database_url, self._on_notify, self._wake_all)

    @property
    def connected(self) -> bool:
        return self._listener.connected.is_set()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._listener.start()

    def stop(self) -> None:
        self._listener.stop()

    def _on_notify(self, payload: str) -> None:
        parsed = parse_payload(payload)
        if parsed is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake, parsed[0])

    def _wake_all(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake_every)

    def _wake(self, job_id: str) -> None:
        for event in self._waiters.get(job_id, ()):
            event.set()

    def _wake_every(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def wait(self, job_id: str, timeout: float) -> None:
        """Return when ``job_id`` changes (or on reconnect), or after ``timeout`` seconds."""
        event = asyncio.Event()
        self._waiters[job_id].add(event)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[job_id]


class QueueNotifier:
    """Wakes a worker's idle slots when a job is queued on one of their queues."""

    def __init__(self, database_url: str, queues: tuple[str, ...]) -> None:
        self.queues = set(queues)
        self.new_job = threading.Event()
        self._listener = Listener(
            database_url, self._on_notify, self.new_job.set, name="curvplan-worker-listen"
        )

    @property
    def connected(self) -> bool:
        return self._listener.connected.is_set()

    def start(self) -> None:
        self._listener.start()

    def stop(self) -> None:
        self._listener.stop()

    def _on_notify(self, payload: str) -> None:
        parsed = parse_payload(payload)
        if parsed is not None and parsed[1] == "queued" and parsed[2] in self.queues:
            self.new_job.set()

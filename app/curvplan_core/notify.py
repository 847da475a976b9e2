"""Waiting without polling: PostgreSQL LISTEN/NOTIFY on job changes.

A trigger on ``job`` (migration ``0006``) runs ``pg_notify('curvplan_job', '<job id>
<status> <queue>')`` when a job's status changes and ``pg_notify('curvplan_queue',
'<queue>')`` when a job is queued (new, or again after a retry or release).
Each API process holds **one** listening connection (:class:`JobNotifier`) and wakes
the long-polls (``GET /v1/jobs/{id}?wait=``) waiting on that job; each worker process
holds one too and wakes its idle slots when a job is queued on their queues.

Polling stays as a slow fallback: a waiter re-checks the database every
``fallback_seconds`` anyway, and after the listening connection is (re)established
every waiter is woken once, because notifications sent while it was down are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Callable

import psycopg

from curvplan_core.config import libpq_url

log = logging.getLogger(__name__)

JOB_CHANNEL = "curvplan_job"  # payload "<job id> <status> <queue>": a status changed
QUEUE_CHANNEL = "curvplan_queue"  # payload "<queue>": a job was queued (new or again)


def parse_payload(payload: str) -> tuple[str, str, str] | None:
    """``(job_id, status, queue)`` of a notification payload, None if malformed."""
    parts = payload.split(" ")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


class Listener:
    """A thread that LISTENs on ``channel`` and calls ``on_notify(payload)``.

    ``on_connect()`` is called each time the connection is (re)established, so that
    waiters can re-check what they may have missed. Reconnects with a 1 s pause.
    """

    def __init__(
        self,
        database_url: str,
        channel: str,
        on_notify: Callable[[str], None],
        on_connect: Callable[[], None],
        name: str = "curvplan-listen",
    ) -> None:
        self.url = libpq_url(database_url)
        self.channel = channel
        self.on_notify = on_notify
        self.on_connect = on_connect
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (it does within a second; daemon, so never waited for)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {self.channel}")
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
        self._listener = Listener(database_url, JOB_CHANNEL, self._on_notify, self._wake_all)

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
        # Wake the event loop only for a job someone waits on (a racy read of the dict is
        # fine: a waiter registers before it reads the job's status).
        if parsed is not None and self._loop is not None and parsed[0] in self._waiters:
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

    def subscribe(self, job_id: str) -> Subscription:
        """Start listening for changes of ``job_id`` (before reading its status, so that a
        change between the read and the wait is not missed); close it when done."""
        return Subscription(self, job_id)


class Subscription:
    """One long-poll's interest in one job: :meth:`wait` returns on a change or timeout."""

    def __init__(self, notifier: JobNotifier, job_id: str) -> None:
        self._notifier = notifier
        self._job_id = job_id
        self._event = asyncio.Event()
        notifier._waiters[job_id].add(self._event)

    async def wait(self, timeout: float) -> None:
        """Until the job changes (or the listener reconnects), at most ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        self._event.clear()

    def close(self) -> None:
        waiters = self._notifier._waiters.get(self._job_id)
        if waiters is not None:
            waiters.discard(self._event)
            if not waiters:
                del self._notifier._waiters[self._job_id]


class QueueNotifier:
    """Wakes a worker's idle slots when a job is queued on one of their queues."""

    def __init__(self, database_url: str, queues: tuple[str, ...]) -> None:
        self.queues = set(queues)
        self._cond = threading.Condition()
        self._generation = 0
        self._listener = Listener(
            database_url, QUEUE_CHANNEL, self._on_notify, self._bump, name="curvplan-worker-listen"
        )

    @property
    def connected(self) -> bool:
        return self._listener.connected.is_set()

    @property
    def generation(self) -> int:
        """Read before a claim; :meth:`wait` returns at once if a job was queued since."""
        with self._cond:
            return self._generation

    def start(self) -> None:
        self._listener.start()

    def stop(self) -> None:
        self._listener.stop()

    def wait(self, seen: int, timeout: float) -> None:
        """Until a job is queued after generation ``seen``, at most ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self._generation != seen, timeout)

    def wake(self) -> None:
        """Wake every waiter now (e.g. the worker is stopping)."""
        self._bump()

    def _bump(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def _on_notify(self, payload: str) -> None:
        if payload in self.queues:
            self._bump()

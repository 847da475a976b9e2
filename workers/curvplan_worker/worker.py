"""The worker: claim a job, run the attempt in a child, heartbeat, write the outcome (fenced).

One :class:`WorkerSlot` runs one job at a time: its main loop claims and supervises
attempts, its heartbeat thread renews the lease, writes the latest progress, reads
the cancel flag, keeps the ``worker`` row fresh and runs the reaper periodically.
``curvplan worker --concurrency N`` runs N slots (N worker rows) in one process;
on a GPU machine run one worker process (one slot) per GPU.

Decisions (each one has a test in tests/queue):

* Lease lost (a fenced heartbeat or outcome write matched no row): the attempt is
  abandoned, its child killed, nothing more is written; the worker goes on.
* Child crash (signal, ``os._exit``, out of memory): attempt outcome ``crashed``;
  the job is re-queued with the same backoff as a lost lease while attempts remain,
  then fails with error type ``worker-crashed``.
* Job errors (``JobError``) and unexpected exceptions fail the job at once (no retry):
  they are deterministic in the request.
* Cancel: the parent sets the child's cancel event when a heartbeat sees
  ``cancel_requested`` (the job trigger's NOTIFY of ``cancelling`` makes the slot beat at
  once, not at its next period); a child that does not stop within ``cancel_grace_seconds`` (1 s:
  the engine checks the flag inside its micro-batch loops) is killed. Either way the job
  ends ``cancelled``, within about 2 s of the request.
* Memory (docs/operations.md#memory-limit): a child whose processes hold more than the
  worker's memory limit (``CURVPLAN_WORKER_MEMORY_LIMIT``, else the cgroup's limit, else
  MemAvailable; shared by the slots) is killed by the supervisor; a SIGKILL the supervisor
  did not send is the kernel's out-of-memory killer when the cgroup's ``oom_kill`` counter
  rose (or when no counter can say). Either out-of-memory end is not retried as is: the
  attempt runs once more at half the micro-batch, then fails with ``out-of-memory``. A
  SIGKILL from elsewhere (the counter stayed put) is a crash like any other.
* A failed child whose parent needs every child (an analysis's block group) fails the parent
  at once and cancels its siblings (``store.fail_parent_fast``).
* Shutdown (SIGTERM/SIGINT): stop claiming, let the running attempt finish within
  ``shutdown_grace_seconds``, else kill it and release the job (queued again, its
  ``max_attempts`` raised by one so the release is not counted). A second signal
  releases at once. Exit code 0.
* Stale workers (no heartbeat for ``worker_stale_seconds``) are marked ``stopped``
  by the reaper; a paused worker that comes back marks itself ``running`` again.
"""

from __future__ import annotations

import contextvars
import logging
import multiprocessing.forkserver
import os
import secrets
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from curvplan.types.jobs import QUEUES
from curvplan_core.config import Settings
from curvplan_core.credentials.service_keys import create_worker_key, worker_key_valid
from curvplan_core.db import make_engine
from curvplan_core.jobs import store
from curvplan_core.jobs.errors import error_dict
from curvplan_core.logging import bind, configure_logging
from curvplan_core.notify import JOB_CHANNEL, Listener, QueueNotifier, parse_payload
from curvplan_core.webhooks.guard import AddressPolicy
from curvplan_worker import webhooks
from curvplan_worker.attempt import (
    AttemptProcess,
    Final,
    MemoryReport,
    Progress,
    classify_kill,
    describe_exit,
    make_context,
)
from curvplan_worker.child import ChildTask, request_json
from curvplan_worker.curvature.limits import AttemptLimits
from curvplan_worker.health import touch_health_file
from curvplan_worker.kinds import KINDS
from curvplan_worker.memstats import OomWatch, tree_rss_bytes, worker_memory_limit
from curvplan_worker.metrics import WorkerMetrics
from curvplan_worker.metrics import serve as serve_metrics

log = logging.getLogger("curvplan.worker")

#: Stage changes kept in a job's progress history (a model with hundreds of blocks stops
#: recording there; the latest progress is always written).
MAX_STAGE_HISTORY = 200

VALID_QUEUES = QUEUES


@dataclass(frozen=True)
class WorkerOptions:
    """Tuning of a worker process; :meth:`from_settings` fills it from the environment."""

    database_url: str
    queues: tuple[str, ...]
    data_dir: Path
    concurrency: int = 1
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 5.0
    poll_interval: float = 1.0
    reaper_interval: float = 5.0
    backoff_base: float = 2.0
    backoff_max: float = 300.0
    worker_stale_seconds: float = 60.0
    cancel_grace_seconds: float = 1.0
    shutdown_grace_seconds: float = 30.0
    start_method: str = "forkserver"
    log_format: str = "console"
    log_level: str = "INFO"
    #: Seconds an attempt of a kind may run before it is killed (error type ``timeout``).
    time_limits: Mapping[str, float] = field(
        default_factory=lambda: {"plan": 900.0, "analyze": 86400.0}
    )
    default_time_limit: float = 86400.0
    #: Idle slots wait on LISTEN/NOTIFY for new jobs; the database is then polled only
    #: every ``notify_fallback_seconds`` (``poll_interval`` without notifications).
    notify: bool = True
    notify_fallback_seconds: float = 15.0
    #: Serve this process's /metrics and /healthz here (None: off).
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: Devices one job may use (data-parallel ranks); jobs asking for more are left to others.
    devices: int = 1
    #: Touched after every heartbeat the database accepted: the worker's health signal
    #: (``curvplan worker-health`` checks its age; the Docker image's HEALTHCHECK runs it).
    health_file: Path | None = None
    #: Storage garbage collection (docs/storage.md): a pass every ``gc_interval_seconds``
    #: (None: never) over stale temp files, expired jobs and unreferenced blobs.
    gc_interval_seconds: float | None = None
    job_retention_days: float | None = None
    blob_gc_grace_seconds: float = 600.0
    temp_file_max_age_seconds: float = 3600.0
    # Webhooks: the sender thread's policy and pacing (Settings.webhook_*).
    webhook_allowed_hosts: tuple[str, ...] = ()
    webhook_allowed_networks: tuple[str, ...] = ()
    webhook_max_attempts: int = 8
    webhook_backoff_seconds: float = 10.0
    webhook_timeout_seconds: float = 10.0
    webhook_poll_seconds: float = 1.0
    public_url: str | None = None
    #: A worker on another host (``CURVPLAN_URL``): each slot creates its own ``worker``
    #: credential through the database and its attempts move blobs through this API.
    api_url: str | None = None
    #: Host memory one job may hold, its processes together (None: unbounded), and whence.
    memory_limit_bytes: int | None = None
    memory_limit_source: str = ""
    #: How often the supervisor reads its child's resident memory against that limit.
    memory_poll_seconds: float = 0.25
    #: The factor on the micro-batch of the one retry after an out-of-memory end.
    oom_micro_batch_factor: float = 0.5

    def time_limit(self, kind: str) -> float:
        """The time limit of ``kind``'s attempts."""
        return float(self.time_limits.get(kind, self.default_time_limit))

    def __post_init__(self) -> None:
        unknown = sorted(set(self.queues) - set(VALID_QUEUES))
        if not self.queues or unknown:
            raise ValueError(f"queues must be a non-empty subset of {VALID_QUEUES}, got {unknown}")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.devices < 1:
            raise ValueError("devices must be at least 1")
        if self.lease_seconds <= 0 or self.poll_interval <= 0 or self.reaper_interval <= 0:
            raise ValueError("lease_seconds, poll_interval and reaper_interval must be positive")
        if not 0 < self.heartbeat_seconds <= self.lease_seconds / 2:
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be positive and at most "
                f"half of lease_seconds ({self.lease_seconds}), or leases expire between beats"
            )
        if self.start_method not in ("forkserver", "spawn"):
            # ``fork`` would copy the threads and other slots' pipes into every child.
            raise ValueError("start_method must be 'forkserver' or 'spawn'")
        for name in ("cancel_grace_seconds", "shutdown_grace_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")

    @classmethod
    def from_settings(
        cls, settings: Settings, queues: list[str], **overrides: object
    ) -> WorkerOptions:
        """Options from ``Settings`` (environment), then ``overrides`` that are not None.

        When only ``lease_seconds`` is overridden, the heartbeat defaults to a third of
        the lease (never more than the configured heartbeat).
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        lease = float(given.get("lease_seconds", settings.lease_seconds))  # type: ignore[arg-type]
        heartbeat = given.get("heartbeat_seconds", min(settings.heartbeat_seconds, lease / 3))
        base = cls(
            database_url=settings.sqlalchemy_url,
            queues=tuple(queues),
            data_dir=settings.data_dir,
            lease_seconds=lease,
            heartbeat_seconds=float(heartbeat),  # type: ignore[arg-type]
            reaper_interval=min(5.0, lease / 2),
            backoff_base=settings.retry_backoff_base_seconds,
            backoff_max=settings.retry_backoff_max_seconds,
            worker_stale_seconds=max(settings.worker_stale_seconds, 2 * lease),
            log_format=settings.log_format,
            log_level=settings.log_level,
            time_limits=dict(settings.job_time_limits),
            default_time_limit=settings.default_job_time_limit,
            notify=settings.job_notify,
            notify_fallback_seconds=settings.notify_fallback_seconds,
            health_file=settings.worker_health_file,
            gc_interval_seconds=settings.gc_interval_seconds or None,
            job_retention_days=settings.job_retention_days,
            blob_gc_grace_seconds=settings.blob_gc_grace_seconds,
            temp_file_max_age_seconds=settings.temp_file_max_age_seconds,
            webhook_allowed_hosts=tuple(settings.webhook_allowed_hosts),
            webhook_allowed_networks=tuple(settings.webhook_allowed_networks),
            webhook_max_attempts=settings.webhook_max_attempts,
            webhook_backoff_seconds=settings.webhook_backoff_seconds,
            webhook_timeout_seconds=settings.webhook_timeout_seconds,
            public_url=settings.public_url,
            devices=settings.worker_devices,
            api_url=settings.worker_api_url,
        )
        rest = {k: v for k, v in given.items() if k not in ("lease_seconds", "heartbeat_seconds")}
        options = replace(base, **rest)  # type: ignore[arg-type]
        if "memory_limit_bytes" not in given:
            limit = worker_memory_limit()  # ValueError naming CURVPLAN_WORKER_MEMORY_LIMIT
            if limit is not None:
                limit = limit.per_slot(options.concurrency)
                options = replace(
                    options, memory_limit_bytes=limit.bytes, memory_limit_source=limit.source
                )
        return options


def new_worker_id() -> str:
    """``<hostname>-<pid>-<random4>``: unique across machines and restarts."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass
class _Current:
    """The attempt a slot runs now, shared by its main loop and its heartbeat thread."""

    fence: store.Fence
    progress: Progress | None = None
    progress_written: Progress | None = None
    #: One ``{"stage", "started_at"}`` per stage change, so a client that polls less often
    #: than stages change still sees every stage the attempt went through, with its timing.
    stages: list[dict[str, str]] = field(default_factory=list)

    def record(self, progress: Progress) -> None:
        """Keep ``progress`` as the latest; note a new stage in the history (capped)."""
        self.progress = progress
        last = self.stages[-1]["stage"] if self.stages else None
        if progress.stage != last and len(self.stages) < MAX_STAGE_HISTORY:
            started = datetime.now(UTC).isoformat()
            self.stages.append({"stage": progress.stage, "started_at": started})

    def progress_payload(self, progress: Progress | None) -> dict[str, Any] | None:
        """What the job row's ``progress`` holds: the latest report and the stage history."""
        if progress is None:
            return None
        return {**progress.as_dict(), "stages": list(self.stages)}

    cancel_requested: bool = False
    lease_lost: bool = False


@dataclass
class _SlotState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    current: _Current | None = None
    beat_now: threading.Event = field(default_factory=threading.Event)


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
        self.metrics = metrics
        self._outcome = "unknown"
        self.engine = engine
        self.mp_context = mp_context
        self.stop = stop
        self.hurry = hurry
        self.worker_id = worker_id or new_worker_id()
        self.state = _SlotState()
        self._heartbeat_done = threading.Event()
        self._last_reap = 0.0
        self._api_key: str | None = None

    # ------------------------------------------------------------------ lifecycle
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
            beat = threading.Thread(
                target=contextvars.copy_context().run,
                args=(self._heartbeat_loop,),
                name=f"heartbeat-{self.worker_id}",
                daemon=True,
            )
            beat.start()
            try:
                self._claim_loop()
            finally:
                self._heartbeat_done.set()
                self.state.beat_now.set()
                beat.join(timeout=10)
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
                    job = store.claim(conn, self.worker_id, queues, self.options.lease_seconds)
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
                    self._run_attempt(job)
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

    # ------------------------------------------------------------------ one attempt
    def _run_attempt(self, job: store.ClaimedJob) -> None:
        fence = job.fence
        if job.kind not in KINDS:
            log.error("claimed a job of unknown kind %r", job.kind)
            self._write_final(
                fence,
                Final(
                    "error",
                    error_dict(
                        "unknown-kind",
                        "Unknown job kind",
                        f"this worker runs {sorted(KINDS)}, not {job.kind!r}",
                    ),
                ),
            )
            return
        try:
            with self.engine.begin() as conn:
                children = store.load_children(conn, fence.job_id)
        except Exception:
            log.exception("could not read the job's children; the lease will expire")
            return
        started = time.monotonic()
        limits = AttemptLimits(
            memory_limit_bytes=self.options.memory_limit_bytes,
            memory_limit_source=self.options.memory_limit_source,
            time_limit_seconds=self.options.time_limit(job.kind),
            started_at=started,
        )
        task = ChildTask(
            children=children,
            kind=job.kind,
            job_id=str(fence.job_id),
            attempt=fence.attempt,
            worker_id=self.worker_id,
            request_json=request_json(job.kind, job.request),
            data_dir=str(self.options.data_dir),
            log_format=self.options.log_format,
            log_level=self.options.log_level,
            api_url=self.options.api_url,
            api_key=self._worker_key() if self.options.api_url else None,
            limits=limits,
        )
        # Heartbeats cover the job from the claim on: starting the child can take
        # seconds the first time (the forkserver imports the kind modules).
        current = _Current(fence=fence)
        with self.state.lock:
            self.state.current = current
        self._outcome = "unknown"
        out_of_memory: list[str] = []
        try:
            while True:
                try:
                    child = AttemptProcess(self.mp_context, task)  # type: ignore[arg-type]
                except Exception as exc:
                    log.exception("could not start the job's process")
                    self._write_crash(
                        fence, f"the job's process could not be started ({exc})", None
                    )
                    return
                log.info("attempt started", extra={"kind": job.kind, "child_pid": child.pid})
                if self.metrics is not None:
                    self.metrics.attempt_started(self.worker_id, str(fence.job_id), child.pid)
                try:
                    ended = self._supervise(child, current, started, job.kind)
                finally:
                    child.kill()
                    child.join(timeout=5)
                    child.close()
                if ended is None:
                    return
                out_of_memory.append(ended)
                factor = self.options.oom_micro_batch_factor
                if len(out_of_memory) > 1 or not 0 < factor < 1:
                    self._write_out_of_memory(fence, current, out_of_memory)
                    return
                # Not as is: once more in this attempt, at a smaller micro-batch.
                log.warning(
                    "attempt ended out of memory (%s): running it again at %g × the micro-batch",
                    ended,
                    factor,
                )
                limits = replace(limits, micro_batch_factor=limits.micro_batch_factor * factor)
                task = replace(task, limits=limits)
        finally:
            if self.metrics is not None:
                self._record_metrics(job.kind, current, started)
            with self.state.lock:
                self.state.current = None

    def _write_out_of_memory(self, fence: store.Fence, current: _Current, ends: list[str]) -> None:
        """The job's error after its out-of-memory retry ended out of memory too."""
        with self.state.lock:
            progress = current.progress_payload(current.progress)
        limit = self.options.memory_limit_bytes
        shown = f"{limit / 2**30:.2f} GiB ({self.options.memory_limit_source})" if limit else "-"
        detail = (
            f"{'; then '.join(ends)}. It ran again at "
            f"{self.options.oom_micro_batch_factor:g} × the micro-batch and ran out of memory "
            f"again; the worker's memory limit is {shown}. Give eval_batch_size, fewer blocks, "
            "a smaller max_iter or fewer tokens, or a worker with more memory "
            "(CURVPLAN_WORKER_MEMORY_LIMIT)"
        )
        error = error_dict("out-of-memory", "The job ran out of memory", detail[:2000])
        self._write_final(fence, Final("error", error), progress=progress)

    def beat_if_cancelling(self, job_id: str) -> None:
        """A NOTIFY said job ``job_id`` is ``cancelling``: if it runs here, beat now (the beat
        reads the flag and hands it to the child) instead of at the next period."""
        with self.state.lock:
            current = self.state.current
        if current is not None and str(current.fence.job_id) == job_id:
            self.state.beat_now.set()

    def _worker_key(self) -> str:
        """This slot's ``worker`` key, created again if the reaper revoked it (the slot was
        paused past the stale limit and came back)."""
        with self.engine.begin() as conn:
            if self._api_key is None or not worker_key_valid(conn, self._api_key):
                self._api_key = create_worker_key(conn, self.worker_id)
                log.info("created a new worker credential (the previous one was revoked)")
        return self._api_key

    def _supervise(
        self, child: AttemptProcess, current: _Current, started: float, kind: str
    ) -> str | None:
        """Run one child to its end and write the outcome, except an out-of-memory end: then
        nothing is written and the words for it are returned (the caller decides on a retry)."""
        opts = self.options
        time_limit = opts.time_limit(kind)
        final: Final | None = None
        cancel_sent_at: float | None = None
        shutdown_deadline: float | None = None
        tick = min(0.05, opts.heartbeat_seconds / 4)
        oom_watch = OomWatch()
        oom_watch.see(child.pid)
        next_memory_check = time.monotonic()
        while True:
            for message in child.receive(tick):
                if isinstance(message, Progress):
                    with self.state.lock:
                        current.record(message)
                elif isinstance(message, MemoryReport):
                    if self.metrics is not None:
                        self.metrics.device_memory_report(self.worker_id, message.devices)
                else:
                    final = message
            with self.state.lock:
                lease_lost = current.lease_lost
                cancel_requested = current.cancel_requested
            if lease_lost:
                self._outcome = "lease-lost"
                if self.metrics is not None:
                    self.metrics.lease_lost.inc()
                child.kill()
                log.warning("lease lost: attempt abandoned, its result will not be written")
                return None
            if final is not None or child.finished_talking or not child.process.is_alive():
                break
            now = time.monotonic()
            if now >= next_memory_check:
                next_memory_check = now + opts.memory_poll_seconds
                oom_watch.see(child.pid)  # the groups it runs in, before it may die
                resident = tree_rss_bytes(child.pid) if opts.memory_limit_bytes else 0
                if opts.memory_limit_bytes is not None and resident > opts.memory_limit_bytes:
                    log.warning(
                        "attempt holds %d bytes, over the worker's memory limit of %d: killing it",
                        resident,
                        opts.memory_limit_bytes,
                    )
                    child.kill()
                    child.join(timeout=5)
                    return (
                        f"the job's processes held {resident / 2**30:.2f} GiB, over the worker's "
                        f"memory limit of {opts.memory_limit_bytes / 2**30:.2f} GiB "
                        f"({opts.memory_limit_source}), and were stopped"
                    )
            if now - started > time_limit and cancel_sent_at is None:
                # A FIFO, a never-ending read or a runaway computation: the limit ends it.
                log.warning(
                    "attempt ran past the %s time limit of %g s: killing it", kind, time_limit
                )
                child.kill()
                child.join(timeout=5)
                final = Final(
                    "error",
                    error_dict(
                        "timeout",
                        "The job ran past its time limit",
                        f"a {kind} attempt may run {time_limit:g} s "
                        "(CURVPLAN_JOB_TIME_LIMITS); it was stopped",
                    ),
                )
                break
            if cancel_requested and cancel_sent_at is None:
                log.info("cancellation requested: asking the job to stop")
                child.request_cancel()
                cancel_sent_at = now
            if cancel_sent_at is not None and now - cancel_sent_at > opts.cancel_grace_seconds:
                log.warning(
                    "job ignored cancellation for %.1f s: killing it", opts.cancel_grace_seconds
                )
                child.kill()
                child.join(timeout=5)
                final = Final("cancelled")
                break
            if self.stop.is_set():
                if shutdown_deadline is None:
                    shutdown_deadline = now + opts.shutdown_grace_seconds
                    log.info(
                        "shutting down: waiting up to %.1f s for the attempt",
                        opts.shutdown_grace_seconds,
                    )
                if now >= shutdown_deadline or self.hurry.is_set():
                    child.kill()
                    child.join(timeout=5)
                    self._release(current.fence)
                    return None
        if final is None:
            # The pipe closed or the process exited: drain what is left, then decide.
            for message in child.receive(0):
                if isinstance(message, Final):
                    final = message
        exitcode = child.join(timeout=5)
        elapsed = time.monotonic() - started
        if final is None:
            # Every kill of the supervisor's own has set ``final`` or returned: this one is not.
            killed = classify_kill(exitcode, oom_watch.kills() if oom_watch.available else None)
            if killed == "kernel-oom":
                return "the kernel's out-of-memory killer stopped the job's process (SIGKILL)"
            if killed == "suspected-oom":
                return (
                    "the job's process was killed by a SIGKILL the worker did not send, most "
                    "likely the out-of-memory killer (no cgroup reports its kills here)"
                )
            detail = describe_exit(exitcode)
            if killed == "external-kill":
                detail = (
                    "the job's process was killed by a SIGKILL from outside the worker (not "
                    "the out-of-memory killer: its cgroup counted no kill)"
                )
            self._write_crash(current.fence, detail, exitcode)
            return None
        with self.state.lock:
            progress = current.progress_payload(current.progress)
        self._write_final(current.fence, final, progress=progress, elapsed=elapsed)
        return None

    # ------------------------------------------------------------------ fenced writes
    def _write_final(
        self,
        fence: store.Fence,
        final: Final,
        *,
        progress: dict[str, Any] | None = None,
        elapsed: float | None = None,
    ) -> None:
        if final.kind == "fan-out":
            self._write_fan_out(fence, final, progress=progress)
            return
        if final.kind == "retry":  # transient: queued again like a crash, with its error
            self._write_crash(fence, "", None, error=final.payload)
            return
        outcome: Literal["succeeded", "failed", "cancelled"]
        result = error = None
        if final.kind == "result":
            outcome, result = "succeeded", final.payload
        elif final.kind == "error":
            outcome, error = "failed", final.payload
        else:
            outcome = "cancelled"
        status = self._fenced_write(
            lambda conn: store.finish(
                conn, fence, outcome, result=result, error=error, progress=progress
            )
        )
        if status is None:
            self._outcome = "lease-lost"
            log.warning("lease lost before the outcome was written; %s result discarded", outcome)
            return
        self._outcome = status
        if status == "failed":
            self._fail_parent_fast(fence.job_id)
        log.info(
            "attempt ended",
            extra={
                "status": status,
                "error_type": (error or {}).get("type"),
                "seconds": None if elapsed is None else round(elapsed, 3),
            },
        )

    def _record_metrics(self, kind: str, current: _Current, started: float) -> None:
        """The attempt's outcome and duration, and how long each stage it reported took."""
        assert self.metrics is not None
        self.metrics.attempt_ended(self.worker_id, kind, self._outcome, time.monotonic() - started)
        with self.state.lock:
            stages = list(current.stages)
        ends = [datetime.fromisoformat(s["started_at"]) for s in stages[1:]]
        ends.append(datetime.now(UTC))
        for stage, end in zip(stages, ends, strict=True):
            seconds = (end - datetime.fromisoformat(stage["started_at"])).total_seconds()
            self.metrics.stage_ended(kind, stage["stage"], max(seconds, 0.0))

    def _fenced_write(self, write: Callable[[Connection], str | None]) -> str | None:
        """Run a fenced outcome write, retrying while the database is unreachable.

        A restarting database must not cost a finished attempt its result: the write is
        retried for up to one lease (after that the reaper re-queues the job anyway). A
        retry after a commit whose answer was lost matches no row (the fence moved on) and
        reads as a lost lease, which is harmless.
        """
        deadline = time.monotonic() + self.options.lease_seconds
        while True:
            try:
                with self.engine.begin() as conn:
                    return write(conn)
            except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
                if time.monotonic() >= deadline:
                    raise
                log.warning("database unavailable for the outcome write (%s); retrying", exc.orig)
                time.sleep(0.5)

    def _write_fan_out(
        self, fence: store.Fence, final: Final, *, progress: dict[str, Any] | None
    ) -> None:
        children = (final.payload or {}).get("children") or []
        status = self._fenced_write(
            lambda conn: store.fan_out(conn, fence, children, progress=progress)
        )
        if status is None:
            self._outcome = "lease-lost"
            log.warning("lease lost before the fan-out was written; no children created")
            return
        self._outcome = status
        log.info("attempt fanned out", extra={"status": status, "children": len(children)})

    def _write_crash(
        self,
        fence: store.Fence,
        detail: str,
        exitcode: int | None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """A crashed attempt, or (``error``: type, title, detail) a transient failure the
        child reported; either way the job runs again while attempts remain."""
        if error is not None:
            detail = str(error.get("detail", ""))
        status = self._fenced_write(
            lambda conn: store.end_crashed(
                conn,
                fence,
                detail=detail,
                backoff_base=self.options.backoff_base,
                backoff_max=self.options.backoff_max,
                error_type=str(error["type"]) if error else "worker-crashed",
                title=str(error["title"]) if error else "The job's process crashed",
            )
        )
        if status is None:
            self._outcome = "lease-lost"
            log.warning("lease lost before the crash was recorded")
            return
        self._outcome = "crashed"
        log.error("attempt crashed: %s", detail, extra={"exitcode": exitcode, "status": status})
        if status == "failed":
            self._fail_parent_fast(fence.job_id)

    def _fail_parent_fast(self, job_id: Any) -> None:
        """A failed child whose parent cannot succeed without it fails that parent now and
        cancels its siblings (``store.fail_parent_fast``); a failure here is only logged: the
        parent's fan-in fails the same way once its children have ended."""
        try:
            with self.engine.begin() as conn:
                parent = store.fail_parent_fast(conn, job_id)
        except Exception:
            log.exception("could not fail the parent of a failed child; its fan-in will")
            return
        if parent is not None:
            log.warning(
                "a failed child failed its parent; the other children were cancelled",
                extra={"parent_id": str(parent)},
            )

    def _release(self, fence: store.Fence) -> None:
        status = self._fenced_write(lambda conn: store.release(conn, fence))
        self._outcome = "released" if status is not None else "lease-lost"
        if status is None:
            log.warning("lease lost before the job could be released")
        else:
            log.info("job released at shutdown", extra={"status": status})

    # ------------------------------------------------------------------ heartbeat thread
    def _heartbeat_loop(self) -> None:
        while not self._heartbeat_done.is_set():
            try:
                self._beat()
                if self.metrics is not None:
                    self.metrics.beat(self.worker_id, True)
                if time.monotonic() - self._last_reap >= self.options.reaper_interval:
                    self._reap()
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

    def _beat(self) -> None:
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

    def _reap(self) -> None:
        self._last_reap = time.monotonic()
        # Two transactions: the reaper locks job rows, the stale check worker rows;
        # holding both at once could deadlock with a revived worker's heartbeat.
        with self.engine.begin() as conn:
            reaped = store.reap_expired(
                conn, backoff_base=self.options.backoff_base, backoff_max=self.options.backoff_max
            )
        with self.engine.begin() as conn:
            stale = store.mark_stale_workers(conn, self.options.worker_stale_seconds)
        for job in reaped:
            if job.status == "failed":
                self._fail_parent_fast(job.job_id)
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


def _gc_loop(options: WorkerOptions, stop: threading.Event) -> None:
    """Storage garbage collection every ``gc_interval_seconds`` until the worker stops.

    Only one process of the deployment collects at a time (a session advisory lock); the
    others skip their turn. Failures are logged and retried at the next turn.
    """
    from curvplan_core.artifacts.blobstore import default_store
    from curvplan_core.storage.gc import collector_lock, run_gc

    assert options.gc_interval_seconds is not None
    engine = make_engine(options.database_url, pool_size=1, max_overflow=1)
    store = default_store(options.data_dir)
    try:
        while not stop.is_set():
            try:
                with collector_lock(engine) as leader:
                    if leader:
                        summary = run_gc(
                            engine,
                            store,
                            retention_days=options.job_retention_days,
                            blob_grace_seconds=options.blob_gc_grace_seconds,
                            temp_max_age_seconds=options.temp_file_max_age_seconds,
                        )
                        if any(v for k, v in summary.items() if k.endswith("_deleted")):
                            log.info("storage garbage collection", extra=summary)
            except Exception:
                log.exception("storage garbage collection failed; retrying next turn")
            stop.wait(options.gc_interval_seconds)
    finally:
        engine.dispose()


def webhook_sender_options(options: WorkerOptions) -> webhooks.SenderOptions:
    return webhooks.SenderOptions(
        policy=AddressPolicy.from_lists(
            options.webhook_allowed_hosts, options.webhook_allowed_networks
        ),
        max_attempts=options.webhook_max_attempts,
        backoff_seconds=options.webhook_backoff_seconds,
        timeout_seconds=options.webhook_timeout_seconds,
        public_url=options.public_url,
    )


def run_worker(options: WorkerOptions) -> int:
    """Run ``options.concurrency`` slots until SIGTERM/SIGINT; return the exit code.

    0 after a graceful shutdown; 1 when a slot could not run (e.g. the database was
    unreachable at start), in which case the other slots are stopped too.
    """
    configure_logging(options.log_format, options.log_level)  # type: ignore[arg-type]
    options.data_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    hurry = threading.Event()
    notifier: QueueNotifier | None = None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            log.warning("second %s: releasing the running job now", signal.Signals(signum).name)
            hurry.set()
        else:
            log.info(
                "%s received: finishing the current job, then stopping", signal.Signals(signum).name
            )
            stop.set()
        if notifier is not None:
            notifier.wake()  # idle slots see the stop at once

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    mp_context = make_context(options.start_method, list(options.queues))
    if options.start_method == "forkserver":
        # Start it now: it imports the kind modules while the slots register.
        multiprocessing.forkserver.ensure_running()
    engine = make_engine(
        options.database_url, pool_size=2 * options.concurrency + 1, max_overflow=2
    )
    if options.notify:  # one LISTEN connection wakes every idle slot of this process
        notifier = QueueNotifier(options.database_url, options.queues)
        notifier.start()
    cancels: Listener | None = None
    metrics = WorkerMetrics() if options.metrics_port is not None else None
    stop_metrics = None
    if metrics is not None and options.metrics_port is not None:
        metrics.slots.set(options.concurrency)
        stop_metrics = serve_metrics(
            metrics, options.metrics_host, options.metrics_port, options.worker_stale_seconds
        )
    slots = [
        WorkerSlot(options, engine, mp_context, stop, hurry, notifier=notifier, metrics=metrics)
        for _ in range(options.concurrency)
    ]
    if options.notify:
        # A cancel reaches the running attempt at once, not at the next heartbeat: the job
        # trigger NOTIFYs every status change, ``cancelling`` included (migration 0006).
        def on_job(payload: str) -> None:
            parsed = parse_payload(payload)
            if parsed is not None and parsed[1] == "cancelling":
                for slot in slots:
                    slot.beat_if_cancelling(parsed[0])

        cancels = Listener(
            options.database_url, JOB_CHANNEL, on_job, lambda: None, name="curvplan-cancel-listen"
        )
        cancels.start()
    failed: list[str] = []

    def run_slot(slot: WorkerSlot) -> None:
        try:
            slot.run()
        except Exception:
            log.exception("worker slot %s failed", slot.worker_id)
            failed.append(slot.worker_id)
            stop.set()

    threads = [
        threading.Thread(target=run_slot, args=(slot,), name=f"slot-{i}", daemon=True)
        for i, slot in enumerate(slots)
    ]
    for thread in threads:
        thread.start()
    # A worker on another host (api_url) holds no store of the API's: it collects nothing.
    if options.gc_interval_seconds is not None and not options.api_url:
        threading.Thread(
            target=_gc_loop, args=(options, stop), name="storage-gc", daemon=True
        ).start()
    sender = threading.Thread(
        target=webhooks.sender_loop,
        args=(engine, webhook_sender_options(options), stop, options.webhook_poll_seconds),
        name="webhooks",
        daemon=True,
    )
    sender.start()
    # The main thread only waits, so that it stays free to handle signals.
    while any(thread.is_alive() for thread in threads):
        for thread in threads:
            thread.join(timeout=0.2)
    sender.join(timeout=15)  # a POST in flight ends within its timeout
    if notifier is not None:
        notifier.stop()
    if cancels is not None:
        cancels.stop()
    if stop_metrics is not None:
        stop_metrics()
    engine.dispose()
    return 1 if failed else 0

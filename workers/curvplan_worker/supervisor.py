"""The attempt supervisor: run one claimed job in a child process to its end.

It starts the child (``curvplan_worker.attempt``), relays its progress to the heartbeat,
and ends it on a lost lease, a cancel (after ``cancel_grace_seconds``), the kind's time
limit, the worker's memory limit or a shutdown (after ``shutdown_grace_seconds``, or at
once on a second signal). An out-of-memory end runs the attempt once more at a smaller
micro-batch, then fails the job with ``out-of-memory``; every other end is written by the
:class:`~curvplan_worker.outcome.OutcomeWriter`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from sqlalchemy import Engine

from curvplan_core.jobs import store
from curvplan_core.jobs.errors import error_dict
from curvplan_worker.attempt import (
    AttemptProcess,
    Final,
    MemoryReport,
    Progress,
    classify_kill,
    describe_exit,
)
from curvplan_worker.attempt_state import CurrentAttempt, SlotState
from curvplan_worker.child import ChildTask, request_json
from curvplan_worker.curvature.limits import AttemptLimits
from curvplan_worker.kinds import KINDS
from curvplan_worker.memstats import OomWatch, tree_rss_bytes
from curvplan_worker.metrics import WorkerMetrics
from curvplan_worker.options import WorkerOptions
from curvplan_worker.outcome import OutcomeWriter

log = logging.getLogger("curvplan.worker")


class AttemptSupervisor:
    """Runs a slot's attempts, one at a time, and writes each one's outcome."""

    def __init__(
        self,
        options: WorkerOptions,
        engine: Engine,
        mp_context: object,
        state: SlotState,
        stop: threading.Event,
        hurry: threading.Event,
        worker_id: str,
        worker_key: Callable[[], str],
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.options = options
        self.engine = engine
        self.mp_context = mp_context
        self.state = state
        self.stop = stop
        self.hurry = hurry
        self.worker_id = worker_id
        self.worker_key = worker_key
        self.metrics = metrics
        self.outcomes = OutcomeWriter(options, engine)
        #: The last attempt's outcome as the metrics count it.
        self.outcome = "unknown"

    def run(self, job: store.ClaimedJob) -> None:
        """Run ``job``'s attempt (and its one out-of-memory retry) and write how it ended."""
        fence = job.fence
        if job.kind not in KINDS:
            log.error("claimed a job of unknown kind %r", job.kind)
            self.outcome = self.outcomes.final(
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
            api_key=self.worker_key() if self.options.api_url else None,
            limits=limits,
        )
        # Heartbeats cover the job from the claim on: starting the child can take
        # seconds the first time (the forkserver imports the kind modules).
        current = CurrentAttempt(fence=fence)
        with self.state.lock:
            self.state.current = current
        self.outcome = "unknown"
        out_of_memory: list[str] = []
        try:
            while True:
                try:
                    child = AttemptProcess(self.mp_context, task)  # type: ignore[arg-type]
                except Exception as exc:
                    log.exception("could not start the job's process")
                    self.outcome = self.outcomes.crash(
                        fence, f"the job's process could not be started ({exc})", None
                    )
                    return
                log.info("attempt started", extra={"kind": job.kind, "child_pid": child.pid})
                if self.metrics is not None:
                    self.metrics.attempt_started(self.worker_id, str(fence.job_id), child.pid)
                try:
                    ended = self._watch(child, current, started, job.kind)
                finally:
                    child.kill()
                    child.join(timeout=5)
                    child.close()
                if ended is None:
                    return
                out_of_memory.append(ended)
                factor = self.options.oom_micro_batch_factor
                if len(out_of_memory) > 1 or not 0 < factor < 1:
                    with self.state.lock:
                        progress = current.progress_payload(current.progress)
                    self.outcome = self.outcomes.out_of_memory(
                        fence, out_of_memory, progress=progress
                    )
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

    def _watch(
        self, child: AttemptProcess, current: CurrentAttempt, started: float, kind: str
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
                self.outcome = "lease-lost"
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
                    self.outcome = self.outcomes.release(current.fence)
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
            self.outcome = self.outcomes.crash(current.fence, detail, exitcode)
            return None
        with self.state.lock:
            progress = current.progress_payload(current.progress)
        self.outcome = self.outcomes.final(current.fence, final, progress=progress, elapsed=elapsed)
        return None

    def _record_metrics(self, kind: str, current: CurrentAttempt, started: float) -> None:
        """The attempt's outcome and duration, and how long each stage it reported took."""
        assert self.metrics is not None
        self.metrics.attempt_ended(self.worker_id, kind, self.outcome, time.monotonic() - started)
        with self.state.lock:
            stages = list(current.stages)
        ends = [datetime.fromisoformat(s["started_at"]) for s in stages[1:]]
        ends.append(datetime.now(UTC))
        for stage, end in zip(stages, ends, strict=True):
            seconds = (end - datetime.fromisoformat(stage["started_at"])).total_seconds()
            self.metrics.stage_ended(kind, stage["stage"], max(seconds, 0.0))

"""The outcome writes of an attempt, each fenced by its claim (``curvplan_core.jobs.lifecycle``).

Every write returns the attempt's outcome as the metrics count it: the job's new status,
``crashed``, ``released`` or ``lease-lost`` (the fence matched no row: the reaper re-queued
the job or another worker holds it, so nothing of this attempt was written).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from curvplan.types.jobs import JobStatus
from curvplan_core.jobs import lifecycle, store
from curvplan_core.jobs.errors import error_dict
from curvplan_core.jobs.records import ProgressRecord
from curvplan_worker.attempt import Final
from curvplan_worker.options import WorkerOptions

log = logging.getLogger("curvplan.worker")


def fail_parent_fast(engine: Engine, job_id: uuid.UUID) -> None:
    """A failed child whose parent cannot succeed without it fails that parent now and
    cancels its siblings (``lifecycle.fail_parent_fast``); a failure here is only logged: the
    parent's fan-in fails the same way once its children have ended."""
    try:
        with engine.begin() as conn:
            parent = lifecycle.fail_parent_fast(conn, job_id)
    except Exception:
        log.exception("could not fail the parent of a failed child; its fan-in will")
        return
    if parent is not None:
        log.warning(
            "a failed child failed its parent; the other children were cancelled",
            extra={"parent_id": str(parent)},
        )


class OutcomeWriter:
    """Writes how an attempt ended, retrying while the database is unreachable."""

    def __init__(self, options: WorkerOptions, engine: Engine) -> None:
        self.options = options
        self.engine = engine

    def fenced_write(self, write: Callable[[Connection], str | None]) -> str | None:
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

    def final(
        self,
        fence: store.Fence,
        final: Final,
        *,
        progress: ProgressRecord | None = None,
        elapsed: float | None = None,
    ) -> str:
        """What the child's last message says: a result, an error, a cancel, a fan-out or a
        transient failure to retry."""
        if final.kind == "fan-out":
            return self.fan_out(fence, final, progress=progress)
        if final.kind == "retry":  # transient: queued again like a crash, with its error
            return self.crash(fence, "", None, error=final.payload)
        outcome: Literal["succeeded", "failed", "cancelled"]
        error = final.payload if final.kind == "error" else None
        if final.kind == "result":
            outcome = "succeeded"
            status = self.fenced_write(
                lambda conn: lifecycle.mark_succeeded(
                    conn, fence, result=final.payload, progress=progress
                )
            )
        elif final.kind == "error":
            outcome = "failed"
            status = self.fenced_write(
                lambda conn: lifecycle.fail(conn, fence, error=error, progress=progress)
            )
        else:
            outcome = "cancelled"
            status = self.fenced_write(
                lambda conn: lifecycle.mark_cancelled(conn, fence, progress=progress)
            )
        if status is None:
            log.warning("lease lost before the outcome was written; %s result discarded", outcome)
            return "lease-lost"
        if status == JobStatus.FAILED:
            fail_parent_fast(self.engine, fence.job_id)
        log.info(
            "attempt ended",
            extra={
                "status": status,
                "error_type": (error or {}).get("type"),
                "seconds": None if elapsed is None else round(elapsed, 3),
            },
        )
        return status

    def fan_out(self, fence: store.Fence, final: Final, *, progress: ProgressRecord | None) -> str:
        children = (final.payload or {}).get("children") or []
        status = self.fenced_write(
            lambda conn: lifecycle.wait_for_children(conn, fence, children, progress=progress)
        )
        if status is None:
            log.warning("lease lost before the fan-out was written; no children created")
            return "lease-lost"
        log.info("attempt fanned out", extra={"status": status, "children": len(children)})
        return status

    def crash(
        self,
        fence: store.Fence,
        detail: str,
        exitcode: int | None,
        error: Mapping[str, Any] | None = None,
    ) -> str:
        """A crashed attempt, or (``error``: type, title, detail) a transient failure the
        child reported; either way the job runs again while attempts remain."""
        if error is not None:
            detail = str(error.get("detail", ""))
        status = self.fenced_write(
            lambda conn: lifecycle.requeue_for_retry(
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
            log.warning("lease lost before the crash was recorded")
            return "lease-lost"
        log.error("attempt crashed: %s", detail, extra={"exitcode": exitcode, "status": status})
        if status == JobStatus.FAILED:
            fail_parent_fast(self.engine, fence.job_id)
        return "crashed"

    def out_of_memory(
        self, fence: store.Fence, ends: list[str], *, progress: ProgressRecord | None
    ) -> str:
        """The job's error after its out-of-memory retry ended out of memory too."""
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
        return self.final(fence, Final("error", error), progress=progress)

    def release(self, fence: store.Fence) -> str:
        """Give the job back at shutdown (queued again, the release not counted)."""
        status = self.fenced_write(lambda conn: lifecycle.release(conn, fence))
        if status is None:
            log.warning("lease lost before the job could be released")
            return "lease-lost"
        log.info("job released at shutdown", extra={"status": status})
        return "released"

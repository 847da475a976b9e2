"""The attempt child process: runs one job kind and reports to the worker through a pipe.

The child never touches the database; the worker parent does every (fenced) write.
Messages on the result pipe, in order:

* ``("progress", fraction, stage, message, eta_seconds)`` any number of times (``eta_seconds``
  None until the kind has an estimate), each followed by
  ``("memory", {device: {allocated, reserved, peak}})`` once the attempt uses CUDA, then at
  most one of
* ``("result", dict)`` (the kind's result model as stored), ``("error", {type, title,
  detail})``, ``("cancelled",)``, ``("retry", {type, title, detail})`` (a transient failure:
  run the job again), or
  ``("fan-out", {"children": [{kind, request, name}], "message": str})``.

A child that exits without a final message crashed (signal, ``os._exit``, out of
memory). The child also watches a *lifeline* pipe whose other end only the worker
holds: when the worker dies (even by SIGKILL) the lifeline reads EOF and the child
exits at once, so an orphaned attempt never keeps running or writing.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from curvplan.types.jobs import JOB_CREATE_TYPES
from curvplan.types.results import stored_result
from curvplan_core.jobs.errors import error_dict
from curvplan_core.jobs.records import ChildRecord, FanOutRecord
from curvplan_worker.curvature.limits import AttemptLimits
from curvplan_worker.errors import JobCancelled, JobError, RetryableError
from curvplan_worker.exit_codes import EXIT_WORKER_GONE
from curvplan_worker.job_context import FanOut, JobContext
from curvplan_worker.kinds import kind_spec, load_request, load_run
from curvplan_worker.memstats import device_memory

log = logging.getLogger("curvplan.worker.child")

MAX_DETAIL_CHARS = 300


@dataclass(frozen=True)
class ChildTask:
    """Everything the child needs to run one attempt (pickled to the child: plain values).

    ``request_json`` is the job's request as stored (the JSON of the kind's create model,
    with the row's ``kind``): the child parses it once into that model
    (:func:`curvplan_worker.kinds.load_request`), so what a client sent crosses the process
    boundary as JSON text, never as a pickled object.
    """

    kind: str
    job_id: str
    attempt: int
    worker_id: str
    request_json: str
    data_dir: str
    log_format: str
    log_level: str
    children: list[ChildRecord] | None = None
    #: A worker on another host: the API's URL and the worker's own key (sent to the child
    #: through the pipe only; never logged, never in the database).
    api_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    #: The worker's memory and time limits, and the micro-batch factor of an OOM retry.
    limits: AttemptLimits | None = None


def request_json(kind: str, stored: dict[str, JsonValue]) -> str:
    """A claimed job's stored request (JSONB, as the driver decoded it: ``ClaimedJob.request``)
    as the JSON text of its ``ChildTask``, with the row's ``kind`` (the column is
    authoritative). The child parses it with its kind's create model."""
    return json.dumps({**stored, "kind": kind}, allow_nan=False)


def _close_inherited_parent_end(lifeline: Connection, parent_end_fd: int) -> None:
    """Close the worker's end of the lifeline if this child inherited a copy (``fork``).

    A copy held by the child itself would keep the pipe open after the worker died.
    The descriptor is closed only if it is the same pipe (same inode), so under
    ``forkserver``/``spawn``, where nothing is inherited, an unrelated fd with the
    same number is left alone.
    """
    try:
        same_pipe = os.fstat(parent_end_fd).st_ino == os.fstat(lifeline.fileno()).st_ino
    except OSError:
        return
    if same_pipe and parent_end_fd != lifeline.fileno():
        os.close(parent_end_fd)


def _watch_lifeline(lifeline: Connection) -> None:
    try:
        lifeline.poll(None)  # returns on EOF: the worker closed it or died
    finally:
        os._exit(EXIT_WORKER_GONE)


def _short_detail(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"


def _run_kind(task: ChildTask, results: Connection, cancel_event: Any) -> tuple[Any, ...]:
    def send_progress(
        fraction: float, stage: str, message: str, eta_seconds: float | None = None
    ) -> None:
        results.send(("progress", fraction, stage, message, eta_seconds))
        memory = device_memory()
        if memory:
            results.send(("memory", memory))

    ctx = JobContext(
        job_id=task.job_id,
        attempt=task.attempt,
        data_dir=Path(task.data_dir),
        send_progress=send_progress,
        is_cancelled=cancel_event.is_set,
        children=task.children,
        api_url=task.api_url,
        api_key=task.api_key,
        limits=task.limits,
    )
    try:
        run = load_run(task.kind)
        result = run(load_request(task.kind, task.request_json), ctx)
        if isinstance(result, FanOut):
            return ("fan-out", _fan_out_payload(task, result))
        # the kind's result model, validated and storable as jsonb, before the worker writes it
        return ("result", stored_result(kind_spec(task.kind).result_type, result))
    except JobCancelled:
        log.info("attempt stopped: cancellation requested")
        return ("cancelled",)
    except JobError as exc:
        log.info("job failed: %s", exc)
        return ("error", exc.as_dict())
    except RetryableError as exc:
        log.warning("attempt failed, to be retried: %s", exc)
        return (
            "retry",
            error_dict(exc.error_type, exc.title, _short_detail(exc)),
        )
    except MemoryError as exc:
        log.exception("job ran out of memory")
        return ("error", error_dict("out-of-memory", "The job ran out of memory", str(exc)))
    except Exception as exc:
        log.exception("job raised an unexpected exception")
        return (
            "error",
            error_dict(
                "internal-error", "Internal error while running the job", _short_detail(exc)
            ),
        )


ROUND_KINDS = frozenset({"sweep"})
"""Kinds whose fan-in may fan out again: a data sweep queues its next round of points
(docs/budget.md#data-sweep); any other kind doing so is a bug."""


def _fan_out_payload(task: ChildTask, fan_out: FanOut) -> FanOutRecord:
    """The children as the worker inserts them: each request a create model of the contract
    (validated when the kind built it), as JSON."""
    if task.children is not None and task.kind not in ROUND_KINDS:
        raise TypeError(f"kind {task.kind!r} fanned out again in its fan-in attempt")
    for child in fan_out.children:
        if not isinstance(child.request, JOB_CREATE_TYPES):
            raise TypeError(f"kind {task.kind!r} fanned out a {type(child.request).__name__}")
    children = [child.stored() for child in fan_out.children]
    json.dumps(children, allow_nan=False)
    return FanOutRecord(children=children, message=fan_out.message)


def child_main(
    task: ChildTask,
    results: Connection,
    lifeline: Connection,
    cancel_event: Any,
    parent_end_fd: int = -1,
) -> None:
    """Entry point of the attempt child (the target of the multiprocessing.Process)."""
    # The worker parent owns shutdown (finish or release the job): a Ctrl-C on the
    # terminal or a SIGTERM sent to the whole process group (systemd) must not end the
    # attempt behind its back. The parent stops a child with SIGKILL; if the parent
    # dies, the lifeline ends the child.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _close_inherited_parent_end(lifeline, parent_end_fd)
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()

    from curvplan_core.logging import bind, configure_logging

    configure_logging(task.log_format, task.log_level)  # type: ignore[arg-type]
    with bind(job_id=task.job_id, attempt=task.attempt, worker_id=task.worker_id):
        final = _run_kind(task, results, cancel_event)
        results.send(final)
    results.close()

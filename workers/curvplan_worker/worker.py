"""The worker process: its slots, signals, notifications, metrics, GC and webhook threads.

One slot (:class:`~curvplan_worker.claim_loop.WorkerSlot`) runs one job at a time, in
three parts, each a module:

* the claim loop (``claim_loop``): register the ``worker`` row, claim, wait when idle;
* the attempt supervisor (``supervisor``): run the claimed job in a child process, end
  it on a cancel, a limit or a shutdown; its fenced outcome writes are ``outcome``'s;
* the heartbeat thread (``heartbeat``): renew the lease, write the latest progress, read
  the cancel flag, keep the ``worker`` row fresh and run the reaper periodically.

``curvplan worker --concurrency N`` runs N slots (N worker rows) in one process;
on a GPU machine run one worker process (one slot) per GPU. The tuning is
:class:`~curvplan_worker.options.WorkerOptions`.

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
  at once and cancels its siblings (``lifecycle.fail_parent_fast``).
* Shutdown (SIGTERM/SIGINT): stop claiming, let the running attempt finish within
  ``shutdown_grace_seconds``, else kill it and release the job (queued again, its
  ``max_attempts`` raised by one so the release is not counted). A second signal
  releases at once. Exit code 0.
* Stale workers (no heartbeat for ``worker_stale_seconds``) are marked ``stopped``
  by the reaper; a paused worker that comes back marks itself ``running`` again.
"""

from __future__ import annotations

import logging
import multiprocessing.forkserver
import signal
import threading
from types import FrameType

from curvplan_core.db import make_engine
from curvplan_core.logging import configure_logging
from curvplan_core.notify import JOB_CHANNEL, Listener, QueueNotifier, parse_payload
from curvplan_core.webhooks.guard import AddressPolicy
from curvplan_worker import webhooks
from curvplan_worker.attempt import make_context
from curvplan_worker.claim_loop import WorkerSlot
from curvplan_worker.metrics import WorkerMetrics
from curvplan_worker.metrics import serve as serve_metrics
from curvplan_worker.options import WorkerOptions

log = logging.getLogger("curvplan.worker")


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
        project_share=options.webhook_project_concurrency,
        breaker_failures=options.webhook_breaker_failures,
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

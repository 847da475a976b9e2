"""The worker's webhook sender: claims due deliveries from the outbox and POSTs them.

A delivery is claimed with ``FOR UPDATE SKIP LOCKED`` and leased (``locked_until``) in a
short transaction, sent outside any transaction, and its outcome written in another: a 2xx
marks it ``succeeded`` (never sent again); anything else schedules a retry after
``backoff · 2^(attempt−1)`` seconds (at most 1 h) until ``max_attempts``, then ``failed``.
Redirects are not followed (a 3xx is a failure), and 4xx other than 408/429 are not retried:
the receiver has said no. Each attempt's outcome is kept in ``webhook_attempt``.

Each delivery is sent in its own thread (``options.batch`` at a time) and any exception of
one delivery is recorded as its failed attempt, so one bad URL or slow receiver never holds
the others. An attempt's whole POST ends within ``timeout_seconds``.

Each POST connects through :class:`curvplan_core.webhooks.guard.AddressPolicy`: the host
is resolved at that moment and every address checked before connecting to it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Engine, text

from curvplan import __version__
from curvplan.types.webhooks import EVENT_ID_HEADER, SIGNATURE_HEADER
from curvplan.webhooks import signature_header
from curvplan_core.webhooks.guard import AddressPolicy, WebhookRefused

log = logging.getLogger("curvplan.webhooks")

MAX_BACKOFF_SECONDS = 3600.0
LEASE_SECONDS = 120
RESPONSE_PREVIEW_BYTES = 512


@dataclass(frozen=True)
class SenderOptions:
    policy: AddressPolicy
    max_attempts: int = 8
    backoff_seconds: float = 10.0
    timeout_seconds: float = 10.0
    public_url: str | None = None
    batch: int = 10


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str | None
    retry: bool

    @property
    def ok(self) -> bool:
        return self.error is None


class _GuardedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, policy: AddressPolicy, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._create_connection = policy.connect


class _GuardedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, policy: AddressPolicy, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._create_connection = policy.connect


def post_event(url: str, body: bytes, headers: dict[str, str], options: SenderOptions) -> Outcome:
    """One POST; never follows a redirect; the address is checked as it is connected to.

    The whole attempt (resolve, connect, send, read the status) ends within
    ``options.timeout_seconds``: a receiver that answers a byte at a time is cut off, so one
    slow receiver holds one sender thread for at most that long.
    """
    try:
        scheme, host, port = options.policy.check_url(url)
    except WebhookRefused as exc:
        return Outcome(None, str(exc), retry=False)
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kind = _GuardedHTTPS if scheme == "https" else _GuardedHTTP
    conn = kind(host, port, options.policy, options.timeout_seconds)
    cut = threading.Event()  # set by the timer before it cuts: the reader may wake first
    deadline = threading.Timer(options.timeout_seconds, _cut_off, args=(conn, cut))
    deadline.daemon = True
    deadline.start()
    try:
        conn.request("POST", target, body=body, headers=headers)
        response = conn.getresponse()
        response.read(RESPONSE_PREVIEW_BYTES)
        code = response.status
    except WebhookRefused as exc:
        return Outcome(None, str(exc), retry=True)  # DNS may change back; retried, then failed
    except (OSError, http.client.HTTPException) as exc:
        late = " (the attempt's time limit passed)" if cut.is_set() else ""
        return Outcome(None, f"{type(exc).__name__}: {exc}{late}", retry=True)
    finally:
        deadline.cancel()
        conn.close()
    if 200 <= code < 300:
        return Outcome(code, None, retry=False)
    if 300 <= code < 400:
        return Outcome(code, f"redirect ({code}) not followed", retry=False)
    retry = code >= 500 or code in (408, 429)
    return Outcome(code, f"the receiver answered {code}", retry=retry)


def _cut_off(conn: http.client.HTTPConnection, cut: threading.Event) -> None:
    """End an attempt past its time limit: a shutdown wakes the thread blocked in recv."""
    cut.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # the raw socket's shutdown, also under TLS
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _claim(engine: Engine, batch: int, max_attempts: int) -> list[Any]:
    """Lease up to ``batch`` due deliveries (counting the attempt now, so that an attempt whose
    sender dies still counts); give up first on those whose last lease ran out at the maximum."""
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                WITH spent AS (
                    UPDATE webhook_delivery
                       SET status = 'failed', next_attempt_at = NULL, locked_until = NULL
                     WHERE status = 'pending' AND attempts >= :max
                       AND (locked_until IS NULL OR locked_until < now())
                 RETURNING id, attempts, locked_until)
                INSERT INTO webhook_attempt
                       (delivery_id, number, started_at, status_code, error, duration_ms)
                SELECT id, attempts,
                       coalesce(locked_until - make_interval(secs => :lease), now()), NULL,
                       'no outcome was recorded (the sender stopped during the attempt)', 0
                  FROM spent WHERE attempts > 0
                ON CONFLICT DO NOTHING
                """
            ),
            {"max": max_attempts, "lease": LEASE_SECONDS},
        )
        return list(
            conn.execute(
                text(
                    """
                    UPDATE webhook_delivery d
                       SET locked_until = now() + make_interval(secs => :lease),
                           attempts = d.attempts + 1
                      FROM webhook_secret s
                     WHERE s.project_id = d.project_id AND d.id IN (
                           SELECT id FROM webhook_delivery
                            WHERE status = 'pending' AND next_attempt_at <= now()
                              AND attempts < :max
                              AND (locked_until IS NULL OR locked_until < now())
                            ORDER BY next_attempt_at
                            LIMIT :batch
                            FOR UPDATE SKIP LOCKED)
                 RETURNING d.id, d.url, d.payload, d.attempts, s.secret
                    """
                ),
                {"lease": LEASE_SECONDS, "batch": batch, "max": max_attempts},
            )
        )


def event_body(payload: dict[str, Any], public_url: str | None) -> bytes:
    """The exact bytes POSTed (and signed): links made absolute with ``public_url``."""
    event = dict(payload)
    if public_url:
        base = public_url.rstrip("/")
        event["links"] = {k: base + v for k, v in (payload.get("links") or {}).items()}
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()


def _record(engine: Engine, row: Any, outcome: Outcome, started: datetime, ms: float,
            options: SenderOptions) -> None:  # fmt: skip
    if outcome.ok:
        status, next_at = "succeeded", None
    elif not outcome.retry or row.attempts >= options.max_attempts:
        status, next_at = "failed", None  # next_attempt_at NULL: never due again
    else:
        status = "pending"
        delay = min(options.backoff_seconds * 2 ** (row.attempts - 1), MAX_BACKOFF_SECONDS)
        next_at = delay
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO webhook_attempt (delivery_id, number, started_at, status_code, "
                "error, duration_ms) VALUES (:id, :n, :started, :code, :error, :ms)"
            ),
            {
                "id": row.id,
                "n": row.attempts,
                "started": started,
                "code": outcome.status_code,
                "error": outcome.error,
                "ms": ms,
            },
        )
        conn.execute(
            text(
                """
                UPDATE webhook_delivery
                   SET status = :status, locked_until = NULL,
                       delivered_at = CASE WHEN :status = 'succeeded' THEN now() END,
                       next_attempt_at = now() + make_interval(
                           secs => CAST(:delay AS double precision))
                 WHERE id = :id
                """
            ),
            {"status": status, "delay": next_at, "id": row.id},
        )


def _attempt(row: Any, options: SenderOptions) -> Outcome:
    """POST one delivery; any fault of its own (a URL the resolver cannot encode, a bug) is its
    failed attempt, retried until its maximum, never an exception that stops the batch."""
    try:
        body = event_body(row.payload, options.public_url)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"curvplan-webhooks/{__version__}",
            SIGNATURE_HEADER: signature_header(row.secret, body),
            EVENT_ID_HEADER: str(row.id),
        }
        return post_event(row.url, body, headers, options)
    except Exception as exc:
        log.exception("webhook attempt raised", extra={"delivery_id": str(row.id)})
        return Outcome(None, f"{type(exc).__name__}: {exc}", retry=True)


def deliver_one(engine: Engine, row: Any, options: SenderOptions) -> Outcome:
    """Attempt one claimed delivery and record its outcome."""
    started = datetime.now(UTC)
    t0 = time.monotonic()
    outcome = _attempt(row, options)
    ms = 1000 * (time.monotonic() - t0)
    _record(engine, row, outcome, started, ms, options)
    if not outcome.ok:
        log.warning(
            "webhook attempt failed",
            extra={"delivery_id": str(row.id), "attempt": row.attempts, "error": outcome.error},
        )
    return outcome


def _deliver_logged(engine: Engine, row: Any, options: SenderOptions) -> None:
    try:
        deliver_one(engine, row, options)
    except Exception:  # the outcome could not be written: the lease runs out, it is retried
        log.exception("webhook outcome not recorded", extra={"delivery_id": str(row.id)})


def deliver_due(engine: Engine, options: SenderOptions) -> int:
    """Send every due delivery (up to ``options.batch``) once, side by side; return how many
    were attempted. Each has its own thread, so a slow or faulty one delays no other."""
    rows = _claim(engine, options.batch, options.max_attempts)
    if rows:
        with ThreadPoolExecutor(max_workers=len(rows), thread_name_prefix="webhook") as pool:
            for row in rows:
                pool.submit(_deliver_logged, engine, row, options)
    return len(rows)


def sender_loop(engine: Engine, options: SenderOptions, stop: threading.Event,
                poll_seconds: float = 1.0) -> None:  # fmt: skip
    """Deliver until ``stop`` is set (the worker runs this in a thread).

    Up to ``options.batch`` deliveries are in flight at once; a free slot claims the next due
    one without waiting for the others, so a receiver that takes its whole time limit holds
    only its own slot.
    """
    inflight: set[Future[None]] = set()
    with ThreadPoolExecutor(max_workers=options.batch, thread_name_prefix="webhook") as pool:
        while not stop.is_set():
            free = options.batch - len(inflight)
            rows: list[Any] = []
            if free > 0:
                try:
                    rows = _claim(engine, free, options.max_attempts)
                except Exception:
                    log.exception("webhook sender failed to claim; retrying")
            inflight |= {pool.submit(_deliver_logged, engine, row, options) for row in rows}
            if inflight:
                _, inflight = wait(inflight, timeout=poll_seconds, return_when=FIRST_COMPLETED)
            else:
                stop.wait(poll_seconds)

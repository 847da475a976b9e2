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

Deliveries are fair across projects (docs/integrations.md#fair-delivery): a project has at
most ``project_share`` deliveries in flight over all senders, the pick goes round-robin over
the projects with something due, and an endpoint (``scheme://host:port`` of a project) that
fails ``breaker_failures`` times in a row is backed off as a whole, circuit-breaker style.
So a burst of deliveries to a receiver that never answers holds a few slots of its own
project, and another project's delivery waits at most one attempt's time limit for a slot.

Events are signed as Standard Webhooks specifies (``curvplan.webhooks``), with the project's
secret and, for an overlap after a rotation, with the rotated-out one beside it.

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

from pydantic import JsonValue
from sqlalchemy import Engine, text

from curvplan import __version__
from curvplan.headline import headline_dict
from curvplan.types.planner import Recommendation
from curvplan.types.webhooks import SentWebhookEvent, StoredWebhookEvent
from curvplan.webhooks import signature_headers
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
    project_share: int = 4  # most deliveries of one project in flight (all senders together)
    breaker_failures: int = 3  # consecutive retryable failures that open an endpoint's breaker


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


# Claims are serialised (a transaction-scoped advisory lock): each counts what is in flight
# per project and endpoint before it leases more, so the shares hold across workers.
CLAIM_LOCK = "curvplan.webhook_claim"

_GIVE_UP_SPENT = """
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

# The due deliveries, fairly: an open endpoint's are skipped (backed off as a whole); a
# half-open one (open_until passed) gets one probe at a time; a project holds at most
# :share deliveries in flight; and the pick goes round-robin across projects (each
# project's oldest due first, then every project's second …), so one project's backlog
# never queues another project's delivery behind it.
_CLAIM = """
WITH busy AS (
    SELECT project_id, endpoint, count(*) AS n FROM webhook_delivery
     WHERE status = 'pending' AND locked_until >= now()
     GROUP BY project_id, endpoint),
project_busy AS (SELECT project_id, sum(n) AS n FROM busy GROUP BY project_id),
due AS (
    SELECT d.id, d.project_id, d.endpoint, d.next_attempt_at,
           e.open_until IS NOT NULL AS half_open,
           row_number() OVER (PARTITION BY d.project_id, d.endpoint
                              ORDER BY d.next_attempt_at, d.id) AS endpoint_rank
      FROM webhook_delivery d
      LEFT JOIN webhook_endpoint e
             ON e.project_id = d.project_id AND e.endpoint = d.endpoint
     WHERE d.status = 'pending' AND d.next_attempt_at <= now() AND d.attempts < :max
       AND (d.locked_until IS NULL OR d.locked_until < now())
       AND (e.open_until IS NULL OR e.open_until <= now())),
allowed AS (
    SELECT due.*,
           row_number() OVER (PARTITION BY due.project_id
                              ORDER BY due.next_attempt_at, due.id) AS project_rank
      FROM due LEFT JOIN busy b USING (project_id, endpoint)
     WHERE NOT due.half_open OR due.endpoint_rank + coalesce(b.n, 0) <= 1),
chosen AS (
    SELECT a.id FROM allowed a LEFT JOIN project_busy p USING (project_id)
     WHERE a.project_rank + coalesce(p.n, 0) <= :share
     ORDER BY a.project_rank, a.next_attempt_at, a.id
     LIMIT :batch)
UPDATE webhook_delivery d
   SET locked_until = now() + make_interval(secs => :lease), attempts = d.attempts + 1
  FROM webhook_secret s, job j
 WHERE s.project_id = d.project_id AND j.id = d.job_id AND d.id IN (SELECT id FROM chosen)
RETURNING d.id, d.project_id, d.url, d.endpoint, d.payload, d.attempts, s.secret,
          CASE WHEN s.previous_expires_at > now() THEN s.previous_secret END AS previous_secret,
          j.result -> 'recommendation' AS recommendation
"""


def _claim(engine: Engine, batch: int, options: SenderOptions) -> list[Any]:
    """Lease up to ``batch`` due deliveries fairly (see ``_CLAIM``), counting the attempt now
    (an attempt whose sender dies still counts); give up first on those whose last lease ran
    out at the maximum."""
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": CLAIM_LOCK})
        conn.execute(text(_GIVE_UP_SPENT), {"max": options.max_attempts, "lease": LEASE_SECONDS})
        return list(
            conn.execute(
                text(_CLAIM),
                {
                    "lease": LEASE_SECONDS,
                    "batch": batch,
                    "max": options.max_attempts,
                    "share": options.project_share,
                },
            )
        )


def budget_summary(recommendation: dict[str, JsonValue] | None) -> dict[str, float] | None:
    """The job's budget and main numbers (``curvplan.headline``'s stable names), or None.
    ``recommendation``: the job's stored JSON, of whatever schema version stored it: parsed
    here, and left out when it no longer parses."""
    if not recommendation:
        return None
    try:
        return headline_dict(Recommendation.model_validate(recommendation))
    except ValueError:  # a recommendation of an older schema: the links still lead to it
        log.warning("webhook event without its budget: the recommendation does not parse")
        return None


def event_body(
    payload: StoredWebhookEvent, public_url: str | None, budget: dict[str, float] | None = None
) -> bytes:
    """The exact bytes POSTed (and signed): links made absolute with ``public_url``, and the
    job's budget summary."""
    event = SentWebhookEvent(**payload, budget=budget)
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
        _update_breaker(conn, row, outcome, options)
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


_BREAKER_FAILED = """
INSERT INTO webhook_endpoint AS e (project_id, endpoint, failures, open_until)
VALUES (:project, :endpoint, 1,
        CASE WHEN :threshold <= 1 THEN now() + make_interval(secs => :base) END)
ON CONFLICT (project_id, endpoint) DO UPDATE
   SET failures = e.failures + 1,
       open_until = CASE WHEN e.failures + 1 >= :threshold THEN now() + make_interval(
           secs => least(:base * power(2, e.failures + 1 - :threshold), :cap)) END
"""


def _update_breaker(conn: Any, row: Any, outcome: Outcome, options: SenderOptions) -> None:
    """An endpoint's breaker: a retryable failure (no answer, 5xx, 408, 429) counts; at
    ``breaker_failures`` in a row the endpoint opens for ``backoff · 2^(failures − threshold)``
    seconds (at most 1 h), and after that one probe at a time is let through; any answer that
    is not a retryable failure (a 2xx, a 4xx: the receiver is there) closes it."""
    if row.endpoint is None:
        return
    key = {"project": row.project_id, "endpoint": row.endpoint}
    if not outcome.ok and outcome.retry:
        conn.execute(
            text(_BREAKER_FAILED),
            {
                **key,
                "threshold": options.breaker_failures,
                "base": options.backoff_seconds,
                "cap": MAX_BACKOFF_SECONDS,
            },
        )
    elif outcome.status_code is not None:
        conn.execute(
            text(
                "DELETE FROM webhook_endpoint WHERE project_id = :project AND endpoint = :endpoint"
            ),
            key,
        )


def _attempt(row: Any, options: SenderOptions) -> Outcome:
    """POST one delivery; any fault of its own (a URL the resolver cannot encode, a bug) is its
    failed attempt, retried until its maximum, never an exception that stops the batch."""
    try:
        body = event_body(row.payload, options.public_url, budget_summary(row.recommendation))
        signing = [row.secret] + ([row.previous_secret] if row.previous_secret else [])
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"curvplan-webhooks/{__version__}",
            **signature_headers(signing, str(row.id), body),
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
    rows = _claim(engine, options.batch, options)
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
                    rows = _claim(engine, free, options)
                except Exception:
                    log.exception("webhook sender failed to claim; retrying")
            inflight |= {pool.submit(_deliver_logged, engine, row, options) for row in rows}
            if inflight:
                _, inflight = wait(inflight, timeout=poll_seconds, return_when=FIRST_COMPLETED)
            else:
                stop.wait(poll_seconds)

"""Rate limits kept in PostgreSQL, shared by every API process (docs/operations.md#rate-limits).

Each limited subject (a key's submissions, a project's, an address's failed authentications)
is one row of ``rate_limit`` holding its GCRA state: the *theoretical arrival time* ``tat``
(Generic Cell Rate Algorithm, ITU-T I.371; the leaky bucket as a meter). A policy of ``q``
requests per ``w`` seconds admits one request every ``T = w/q`` seconds on average and a
burst of up to ``q``: a request at ``now`` is admitted when ``max(tat, now) + T ≤ now + w``,
and then ``tat`` becomes ``max(tat, now) + T``. The test and the update are one ``INSERT …
ON CONFLICT DO UPDATE … WHERE`` statement, atomic under concurrency across processes.

A subject found over its limit is remembered in the process until it may send again, so a
runaway loop's further requests are answered 429 without touching the database.

Answers carry the fields of the IETF draft ``draft-ietf-httpapi-ratelimit-headers-09``
(``RateLimit-Policy: "<name>";q=<quota>;w=<window>`` and ``RateLimit: "<name>";r=<remaining>;
t=<seconds to full quota>``, the policy closest to exhaustion) and, on a 429, ``Retry-After``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from curvplan_server.problems import Problem

_HIT = text(
    """
    INSERT INTO rate_limit AS r (bucket, tat)
    VALUES (:bucket, clock_timestamp() + make_interval(secs => :interval))
    ON CONFLICT (bucket) DO UPDATE
       SET tat = greatest(r.tat, clock_timestamp()) + make_interval(secs => :interval)
     WHERE greatest(r.tat, clock_timestamp()) + make_interval(secs => :interval)
           <= clock_timestamp() + make_interval(secs => :window)
    RETURNING extract(epoch FROM tat - clock_timestamp())::float8 AS ahead
    """
)
# A bucket whose tat has passed is a full one, the same as no row: such rows are dropped now
# and then (every ``SWEEP_EVERY`` database hits of a process), so the table holds only
# subjects active within their window.
_SWEEP = text("DELETE FROM rate_limit WHERE tat < clock_timestamp()")
SWEEP_EVERY = 1000
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")
_AHEAD = text(
    "SELECT extract(epoch FROM tat - clock_timestamp())::float8 FROM rate_limit "
    "WHERE bucket = :bucket"
)


@dataclass(frozen=True)
class RatePolicy:
    """``quota`` requests per ``window`` seconds (a burst of up to ``quota``)."""

    name: str
    quota: int
    window: float

    @property
    def interval(self) -> float:
        """Seconds one request uses of the window (``T = w/q``)."""
        return self.window / self.quota

    def field(self) -> str:
        """This policy as a member of ``RateLimit-Policy``."""
        return f'"{self.name}";q={self.quota};w={math.ceil(self.window)}'


@dataclass(frozen=True)
class Verdict:
    """The outcome for the policy closest to exhaustion (or the one that refused)."""

    allowed: bool
    policy: RatePolicy
    remaining: int
    reset_seconds: float  # until the quota is whole again
    retry_after: float  # until one request is admitted again (0 when allowed)
    policies: tuple[RatePolicy, ...]

    def headers(self) -> dict[str, str]:
        """``RateLimit-Policy`` and ``RateLimit`` (draft-09), and ``Retry-After`` on a 429."""
        out = {
            "RateLimit-Policy": ", ".join(p.field() for p in self.policies),
            "RateLimit": f'"{self.policy.name}";r={self.remaining};'
            f"t={math.ceil(max(0.0, self.reset_seconds))}",
        }
        if not self.allowed:
            out["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return out


def _verdict(policy: RatePolicy, ahead: float, allowed: bool,
             policies: tuple[RatePolicy, ...]) -> Verdict:  # fmt: skip
    """``ahead``: seconds ``tat`` is past now (after the request, when it was admitted)."""
    ahead = max(0.0, ahead)
    remaining = max(0, min(policy.quota, math.floor((policy.window - ahead) / policy.interval)))
    retry_after = 0.0 if allowed else max(0.0, ahead + policy.interval - policy.window)
    return Verdict(allowed, policy, remaining, ahead, retry_after, policies)


class RateLimiter:
    """Admits or refuses requests against PostgreSQL-kept policies (see the module doc)."""

    def __init__(self, enabled: bool = True, max_blocked: int = 100_000) -> None:
        self.enabled = enabled
        self.max_blocked = max_blocked
        self._blocked: dict[str, tuple[float, Verdict]] = {}
        self._lock = threading.Lock()
        self._hits = 0

    def blocked(self, bucket: str) -> Verdict | None:
        """The refusal this process remembers for ``bucket``, while it lasts (no DB query)."""
        with self._lock:
            hit = self._blocked.get(bucket)
            if hit is None:
                return None
            until, verdict = hit
            left = until - time.monotonic()
            if left <= 0:
                del self._blocked[bucket]
                return None
        return Verdict(False, verdict.policy, 0, verdict.reset_seconds, left, verdict.policies)

    def _remember(self, bucket: str, verdict: Verdict) -> None:
        with self._lock:
            if len(self._blocked) >= self.max_blocked:
                now = time.monotonic()
                self._blocked = {k: v for k, v in self._blocked.items() if v[0] > now}
                if len(self._blocked) >= self.max_blocked:
                    self._blocked.clear()
            self._blocked[bucket] = (time.monotonic() + verdict.retry_after, verdict)

    def hit(self, engine: Engine, subjects: Sequence[tuple[str, RatePolicy]]) -> Verdict | None:
        """Count one request against every ``(bucket, policy)``: all admit it (counted in each)
        or none does (counted in none). The verdict of the policy closest to exhaustion, or of
        the first that refused; None when limits are off or there is no subject."""
        if not self.enabled or not subjects:
            return None
        policies = tuple(policy for _, policy in subjects)
        for bucket, _ in subjects:
            remembered = self.blocked(bucket)
            if remembered is not None:
                return remembered
        with self._lock:
            self._hits += 1
            sweep = self._hits % SWEEP_EVERY == 0
        if sweep:
            with engine.begin() as conn:
                conn.execute(_SWEEP)
        with engine.begin() as conn:
            # A count lost in a crash costs nothing: do not wait for the WAL flush.
            conn.execute(_ASYNC_COMMIT)
            verdicts = []
            for bucket, policy in subjects:
                verdict = self._hit_one(conn, bucket, policy, policies)
                if not verdict.allowed:
                    conn.rollback()  # the subjects that admitted it do not count it either
                    self._remember(bucket, verdict)
                    return verdict
                verdicts.append(verdict)
        return min(verdicts, key=lambda v: (v.remaining / v.policy.quota, v.remaining))

    @staticmethod
    def _hit_one(conn: Connection, bucket: str, policy: RatePolicy,
                 policies: tuple[RatePolicy, ...]) -> Verdict:  # fmt: skip
        params = {"bucket": bucket, "interval": policy.interval, "window": policy.window}
        ahead = conn.execute(_HIT, params).scalar_one_or_none()
        if ahead is not None:
            return _verdict(policy, ahead, True, policies)
        current = conn.execute(_AHEAD, {"bucket": bucket}).scalar_one()
        return _verdict(policy, current, False, policies)


def too_many_requests(verdict: Verdict, what: str) -> Problem:
    """The 429 answer for a refused ``verdict`` (``what``: the limited thing, for the detail)."""
    wait = verdict.headers()["Retry-After"]
    return Problem(
        429,
        f"too many {what}: the limit is {verdict.policy.quota} per "
        f"{verdict.policy.window:g} s ({verdict.policy.name}); retry after {wait} s",
        title="Too Many Requests",
        headers=verdict.headers(),
        extra={"policy": verdict.policy.name, "retry_after": int(wait)},
    )

"""Verify the webhooks a curvplan service sends (no server code, standard library + pydantic).

    from curvplan.webhooks import WebhookVerifier

    verifier = WebhookVerifier(secret)              # the project's whsec_… secret
    event = verifier.verify(request_body_bytes, request.headers["Curvplan-Signature"])

The header is ``t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``: the
timestamp is signed with the exact body bytes, so a changed body, a changed timestamp or
another secret fails; an event older than ``tolerance`` seconds fails (a replay of a
captured request), and :class:`WebhookVerifier` also refuses an event id it has already
accepted (a replay within the tolerance). Several ``v1=`` entries may be present (e.g. while
a secret is rotated); one valid entry suffices.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict

from curvplan.types.webhooks import EVENT_ID_HEADER, SIGNATURE_HEADER, WebhookEvent

DEFAULT_TOLERANCE_SECONDS = 300

__all__ = [
    "DEFAULT_TOLERANCE_SECONDS",
    "EVENT_ID_HEADER",
    "SIGNATURE_HEADER",
    "WebhookEvent",
    "WebhookVerificationError",
    "WebhookVerifier",
    "sign",
    "signature_header",
    "verify",
]


class WebhookVerificationError(ValueError):
    """The request is not an authentic, fresh, first-seen curvplan event."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """hex HMAC-SHA256 over ``"<timestamp>." + body`` with ``secret``."""
    message = str(int(timestamp)).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The ``Curvplan-Signature`` value for ``body`` signed now (or at ``timestamp``)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t},v1={sign(secret, t, body)}"


def _parse(header: str) -> tuple[int, list[str]]:
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise WebhookVerificationError("the signature timestamp is not a number") from None
        elif key == "v1" and value:
            signatures.append(value)
    if timestamp is None or not signatures:
        raise WebhookVerificationError(f"malformed {SIGNATURE_HEADER} header (need t= and v1=)")
    return timestamp, signatures


def verify(
    body: bytes,
    header: str | None,
    secret: str,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> WebhookEvent:
    """The event in ``body`` if ``header`` signs it with ``secret`` within ``tolerance`` s.

    Raises :class:`WebhookVerificationError` otherwise. Pass the raw request body: a body
    parsed and re-serialised is not the signed byte string.
    """
    if not header:
        raise WebhookVerificationError(f"no {SIGNATURE_HEADER} header")
    timestamp, signatures = _parse(header)
    expected = sign(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, s) for s in signatures):
        raise WebhookVerificationError("the signature does not match the body and secret")
    age = (time.time() if now is None else now) - timestamp
    if abs(age) > tolerance:
        raise WebhookVerificationError(
            f"the signature is {age:.0f} s old (tolerance {tolerance:g} s): a replay?"
        )
    try:
        return WebhookEvent.model_validate_json(body)
    except ValueError as exc:
        raise WebhookVerificationError(f"the body is not a curvplan event: {exc}") from None


class WebhookVerifier:
    """:func:`verify` plus a memory of accepted event ids: a replayed event is refused.

    Keeps the last ``remember`` ids (an event is only accepted within ``tolerance`` of its
    signature, so ids older than that need not be kept by a receiver that sees fewer than
    ``remember`` events per tolerance window). Not shared between processes: a receiver
    with several processes dedupes on ``event.id`` in its own store.
    """

    def __init__(
        self, secret: str, *, tolerance: float = DEFAULT_TOLERANCE_SECONDS, remember: int = 10_000
    ) -> None:
        self.secret = secret
        self.tolerance = tolerance
        self.remember = remember
        self._seen: OrderedDict[str, None] = OrderedDict()

    def verify(self, body: bytes, header: str | None, *, now: float | None = None) -> WebhookEvent:
        event = verify(body, header, self.secret, tolerance=self.tolerance, now=now)
        if event.id in self._seen:
            raise WebhookVerificationError(f"event {event.id} was already received (a replay)")
        self._seen[event.id] = None
        while len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        return event
